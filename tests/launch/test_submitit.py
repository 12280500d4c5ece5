"""Hydra sweeps through submitit (hydra/launcher=submitit_local): one submitit job per trial,
whose tasks are the trial's ranks (CPU, gloo); the sweep summary as for any sweep."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clorch.config import compose

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs the slurm extra")
pytestmark = pytest.mark.timeout(240)
ROOT = Path(__file__).resolve().parents[2]
TINY = ["+recipe=cpu_smoke", "data.sample_count=64"]


def _sweep(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "clorch.cli",
        "-m",
        "hydra/launcher=submitit_local",
        "hydra.launcher.tasks_per_node=2",
        *args,
    ]
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in names and not k.startswith(("SLURM_", "TORCHELASTIC_", "SUBMITIT_", "CLORCH_"))
    }
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=200)


def test_each_trial_is_a_submitit_job_whose_tasks_are_its_ranks(tmp_path, local_run):
    sweep_dir = tmp_path / "sweep"
    done = _sweep([*TINY, "optim.lr=1e-3,3e-3", f"hydra.sweep.dir={sweep_dir}"], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for trial in ("0", "1"):
        summary = json.loads((sweep_dir / trial / "summary.json").read_text())
        assert summary["status"] == "succeeded" and summary["launcher"] == "submitit"
        assert summary["world_size"] == 2
    with open(sweep_dir / "sweep_summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["recipe"], r["optim.lr"], r["status"]) for r in rows] == [
        ("0", "cpu_smoke", "0.001", "succeeded"),
        ("1", "cpu_smoke", "0.003", "succeeded"),
    ]
    # A trial's two tasks train as a 2-rank job started by clorch's own launcher does: trial 1's
    # optim.lr=3e-3 is cpu_smoke's own, so that job is the run tests/launch/test_torchrun_launcher.py shares.
    assert compose(["+recipe=cpu_smoke"]).optim.lr == 3e-3
    local = local_run(recipe="cpu_smoke", sample_count=64, progress="off")
    trial = json.loads((sweep_dir / "1" / "summary.json").read_text())
    assert local["summary"]["weights_sha256"] == trial["weights_sha256"]


def test_config_errors_stop_the_sweep_before_anything_is_submitted(tmp_path):
    sweep_dir = tmp_path / "sweep"
    done = _sweep([*TINY, "optim.lr=-1,3e-3", f"hydra.sweep.dir={sweep_dir}"], tmp_path)
    assert done.returncode == 2, done.stderr
    assert "optim.lr must be > 0, got -1" in done.stderr
    assert not sweep_dir.exists()
