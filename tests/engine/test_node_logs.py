"""The nodes of one job (clorch's local launcher, launcher.nnodes > 1) sharing one run directory
keep their launchers' records apart: node 0's in logs/, node k's in logs/node<k>/."""

from __future__ import annotations

from pathlib import Path

import pytest

from clorch.config import compose
from clorch.engine.run import node_log_dir
from clorch.plan.plan import resolve

pytestmark = pytest.mark.timeout(60)
SLURM = ("SLURM_NNODES", "SLURM_NODEID", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_JOB_ID", "SLURM_JOBID")


def _plan(*overrides: str):
    return resolve(compose(["+recipe=cpu_smoke", "launcher.nproc_per_node=1", *overrides]))


def test_node_k_writes_under_logs_node_k(monkeypatch):
    for name in SLURM:
        monkeypatch.delenv(name, raising=False)
    run_dir = Path("/shared/run")
    assert node_log_dir(_plan(), run_dir) == run_dir / "logs"
    nodes = ["launcher.nnodes=3", "launcher.master_port=29555"]
    assert node_log_dir(_plan(*nodes, "launcher.node_rank=0"), run_dir) == run_dir / "logs"
    assert node_log_dir(_plan(*nodes, "launcher.node_rank=2"), run_dir) == run_dir / "logs" / "node2"


def test_slurm_places_the_node_where_the_launcher_takes_its_layout_from_it(monkeypatch):
    monkeypatch.setenv("SLURM_NNODES", "2")
    monkeypatch.setenv("SLURM_NODEID", "1")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node-a,node-b")
    monkeypatch.setenv("SLURM_JOB_ID", "1234")
    run_dir = Path("/shared/run")
    assert node_log_dir(_plan(), run_dir) == run_dir / "logs" / "node1"
