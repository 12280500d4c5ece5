"""Beyond one launcher: two launchers on loopback (nnodes=2), SLURM's variables, and torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from clorch.env import with_multicast_off
from clorch.launch import launch
from clorch.launch.procs import reserve_free_port
from clorch.launch.slurm import PORT_BASE, PORT_SPAN

pytestmark = pytest.mark.timeout(90)
ROOT = Path(__file__).resolve().parents[2]


def _expected_sum(seeds, size: int) -> list[float]:
    """The all_reduce result, computed in this one process from every rank's random input."""
    tensors = [torch.randn(size, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
               for s in seeds]
    return torch.stack(tensors).sum(0).tolist()


def test_two_launchers_on_loopback(tmp_path):
    port = reserve_free_port()
    common = dict(nproc_per_node=1, nnodes=2, backend="gloo", master_port=port, timeout=60)
    node0 = launch("tests.launch.workers:gloo_all_reduce", node_rank=0, log_dir=tmp_path / "n0", **common)
    node1 = launch("tests.launch.workers:gloo_all_reduce", node_rank=1, log_dir=tmp_path / "n1", **common)
    with node0, node1:
        first, second = node0.wait(60), node1.wait(60)
    assert first["state"] == second["state"] == "succeeded", (node0.logs(0), node1.logs(1))
    assert first["ranks"] == [0] and second["ranks"] == [1]
    rank0, rank1 = first["results"][0], second["results"][1]
    assert first["results"][1] is None and second["results"][0] is None, "each node reports its own ranks"
    expected = _expected_sum([1000, 1001], 5)
    torch.testing.assert_close(torch.tensor(rank0["sum"]), torch.tensor(expected))
    torch.testing.assert_close(torch.tensor(rank1["sum"]), torch.tensor(expected))
    assert rank0["ctx"] == {"rank": 0, "local_rank": 0, "world_size": 2, "backend": "gloo", "args": None}
    assert rank1["ctx"] == {"rank": 1, "local_rank": 0, "world_size": 2, "backend": "gloo", "args": None}
    assert rank0["group_size"] == rank1["group_size"] == 2


def test_slurm_variables_place_each_launcher(tmp_path, monkeypatch):
    """Two launchers that differ only in SLURM_NODEID agree on the master and the port."""
    port = reserve_free_port()
    while not PORT_BASE <= port < PORT_BASE + PORT_SPAN:
        port = reserve_free_port()
    monkeypatch.setenv("SLURM_NNODES", "2")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "localhost,otherhost")
    monkeypatch.setenv("SLURM_JOB_ID", str(port - PORT_BASE + 7 * PORT_SPAN))
    jobs = []
    for node in (0, 1):
        monkeypatch.setenv("SLURM_NODEID", str(node))
        jobs.append(launch("tests.launch.workers:report", nproc_per_node=2, backend=None,
                           log_dir=tmp_path / f"n{node}"))
    with jobs[0], jobs[1]:
        statuses = [job.wait(30) for job in jobs]
    envs = {r: s["results"][r]["env"] for s in statuses for r in s["ranks"]}
    assert sorted(envs) == [0, 1, 2, 3]
    for rank, env in envs.items():
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["GROUP_RANK"]) == (
            str(rank), "4", str(rank % 2), str(rank // 2))
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("localhost", str(port))


def test_torchrun_runs_a_process_group_worker(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--standalone", "--nproc-per-node", "2",
               str(ROOT / "tests" / "launch" / "torchrun_worker.py"), str(tmp_path)]
    # TMPDIR: torchrun's own scratch directories stay inside tmp_path.
    env = with_multicast_off({**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
                              "TMPDIR": str(tmp_path)})
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=80)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in (0, 1)]
    expected = torch.tensor(_expected_sum([2000, 2001], 4))
    for rank, report in enumerate(reports):
        assert (report["rank"], report["world_size"], report["local_rank"]) == (rank, 2, rank)
        assert report["torchelastic"] is True
        torch.testing.assert_close(torch.tensor(report["sum"]), expected)
