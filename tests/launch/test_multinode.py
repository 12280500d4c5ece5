"""Beyond one launcher: two launchers on loopback (nnodes=2), SLURM's variables, and torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from clorch.env import with_multicast_off
from clorch.launch import launch
from tests.harness import free_port
from clorch.launch.slurm import PORT_BASE, PORT_SPAN

pytestmark = pytest.mark.timeout(90)
ROOT = Path(__file__).resolve().parents[2]


def _expected_sum(seeds, size: int) -> list[float]:
    """The all_reduce result, computed in this one process from every rank's random input."""
    tensors = [torch.randn(size, generator=torch.Generator().manual_seed(s), dtype=torch.float64) for s in seeds]
    return torch.stack(tensors).sum(0).tolist()


def test_two_launchers_on_loopback(tmp_path):
    port = free_port()
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
    port = free_port()
    while not PORT_BASE <= port < PORT_BASE + PORT_SPAN:
        port = free_port()
    monkeypatch.setenv("SLURM_NNODES", "2")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "localhost,otherhost")
    monkeypatch.setenv("SLURM_JOB_ID", str(port - PORT_BASE + 7 * PORT_SPAN))
    jobs = []
    for node in (0, 1):
        monkeypatch.setenv("SLURM_NODEID", str(node))
        jobs.append(
            launch("tests.launch.workers:report", nproc_per_node=2, backend=None, log_dir=tmp_path / f"n{node}")
        )
    with jobs[0], jobs[1]:
        statuses = [job.wait(30) for job in jobs]
    envs = {r: s["results"][r]["env"] for s in statuses for r in s["ranks"]}
    assert sorted(envs) == [0, 1, 2, 3]
    for rank, env in envs.items():
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["GROUP_RANK"]) == (
            str(rank),
            "4",
            str(rank % 2),
            str(rank // 2),
        )
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("localhost", str(port))


def test_torchrun_runs_a_process_group_worker(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [
        str(torchrun),
        "--standalone",
        "--nproc-per-node",
        "2",
        str(ROOT / "tests" / "launch" / "torchrun_worker.py"),
        str(tmp_path),
    ]
    # TMPDIR: torchrun's own scratch directories stay inside tmp_path.
    env = with_multicast_off({**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)})
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=80)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in (0, 1)]
    expected = torch.tensor(_expected_sum([2000, 2001], 4))
    for rank, report in enumerate(reports):
        assert (report["rank"], report["world_size"], report["local_rank"]) == (rank, 2, rank)
        assert report["torchelastic"] is True
        torch.testing.assert_close(torch.tensor(report["sum"]), expected)


def _alone(tmp_path, node_rank: int, nnodes: int = 2, port: int | None = None, **kw):
    port = port or free_port()
    return launch(
        "tests.launch.workers:gloo_all_reduce",
        nproc_per_node=1,
        nnodes=nnodes,
        node_rank=node_rank,
        backend="gloo",
        master_port=port,
        log_dir=tmp_path / f"n{node_rank}",
        **{"rdzv_timeout": 2, **kw},
    ), port


@pytest.fixture(scope="module")
def waiting(tmp_path_factory):
    """The jobs whose other nodes never come (or come wrong), started together so that their
    rendezvous timeouts run out side by side: {name: (start time, the jobs, the port)}."""
    tmp, jobs = tmp_path_factory.mktemp("waiting"), {}
    for name in ("node0", "node1", "disagree"):
        (tmp / name).mkdir()
    start = time.monotonic()
    job, port = _alone(tmp / "node0", node_rank=0)
    jobs["node 0 alone"] = (start, [job], port)
    start = time.monotonic()
    job, port = _alone(tmp / "node1", node_rank=1)
    jobs["node 1 alone"] = (start, [job], port)
    start = time.monotonic()
    node0, port = _alone(tmp / "disagree", node_rank=0, rdzv_timeout=4)
    node1, _ = _alone(tmp / "disagree", node_rank=1, nnodes=3, port=port, rdzv_timeout=4)
    jobs["disagree"] = (start, [node0, node1], port)
    jobs["clorch-train"] = _missing_node(tmp)
    yield jobs
    for name, (_, started, _) in jobs.items():
        for job in started:
            if name != "clorch-train":
                job.__exit__(None, None, None)  # stopped, should a test have left it running
            elif job.poll() is None:  # its test failed before waiting for it
                job.kill()
                job.communicate()


def test_node_0_alone_fails_within_the_rendezvous_timeout(waiting):
    start, (job,), port = waiting["node 0 alone"]
    status = job.wait(30)
    assert time.monotonic() - start < 2 + 5
    assert status["state"] == "failed" and status["pids"] == [], "no rank may start"
    error = status["error"]
    assert error["type"] == "RendezvousTimeout"
    assert error["message"] == (
        f"the nodes did not meet at 127.0.0.1:{port} (master_addr:master_port) "
        "within 2 s (rdzv_timeout): node(s) 0 joined (1 of 2)"
    )


def test_node_1_alone_says_node_0_never_answered(waiting):
    _, (job,), port = waiting["node 1 alone"]
    status = job.wait(30)
    assert status["state"] == "failed" and status["pids"] == []
    assert f"did not meet at 127.0.0.1:{port}" in status["error"]["message"]
    assert "node 0 never answered there; node 1 waited" in status["error"]["message"]


def test_nodes_that_disagree_on_nnodes_are_told_why(waiting):
    _, (node0, node1), _ = waiting["disagree"]
    with node0, node1:
        first, second = node0.wait(30), node1.wait(30)
    assert first["state"] == second["state"] == "failed"
    assert second["error"]["message"] == "node 1 was started with nnodes=3, node 0 with nnodes=2"
    assert "node(s) 0 joined (1 of 2)" in first["error"]["message"]


def test_stop_while_waiting_for_the_other_nodes(tmp_path):
    job, _ = _alone(tmp_path, node_rank=0, rdzv_timeout=60)
    time.sleep(0.5)
    start = time.monotonic()
    status = job.stop(timeout=30)
    assert time.monotonic() - start < 5
    assert status["state"] == "stopped" and status["pids"] == []


def _missing_node(tmp: Path) -> tuple[float, list[subprocess.Popen], tuple[int, Path]]:
    """`clorch-train` as node 0 of 2 whose node 1 never comes, started in a new folder of `tmp`:
    (its start, [it], (its port, the folder))."""
    tmp_path = tmp / "clorch-train"
    tmp_path.mkdir()
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "clorch.cli",
        "+recipe=cpu_smoke",
        "launcher.nnodes=2",
        f"launcher.master_port={port}",
        "launcher.rdzv_timeout=2",
        "launcher.nproc_per_node=1",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.monotonic()
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return start, [proc], (port, tmp_path)


def test_clorch_train_with_a_missing_node_exits_with_the_message(waiting):
    """Started with the other waiting jobs (the fixture), as its own process."""
    start, (proc,), (port, tmp_path) = waiting["clorch-train"]
    _, stderr = proc.communicate(timeout=max(60 - (time.monotonic() - start), 1))
    done = subprocess.CompletedProcess(proc.args, proc.returncode, "", stderr)
    assert done.returncode == 1, done.stderr
    assert (
        f"job failed: RendezvousTimeout: the nodes did not meet at 127.0.0.1:{port} "
        "(master_addr:master_port) within 2 s (rdzv_timeout): node(s) 0 joined (1 of 2)"
    ) in done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"]["type"] == "RendezvousTimeout"


def test_collective_timeout_ends_a_job_whose_rank_skipped_a_collective(tmp_path):
    start = time.monotonic()
    job = launch(
        "tests.launch.workers:rank_1_skips_a_collective",
        nproc_per_node=2,
        backend="gloo",
        collective_timeout=3,
        log_dir=tmp_path / "logs",
    )
    status = job.wait(60)
    assert time.monotonic() - start < 3 + 20
    assert status["state"] == "failed" and status["failed_rank"] == 0
    assert "Timed out waiting 3000ms" in status["error"]["message"]


def test_a_joining_node_asks_again_while_another_program_holds_the_port(tmp_path):
    """Node 1 restarting alone finds node 0's ranks' store on the port: it retries until node 0 meets."""
    import socket
    import threading

    from clorch.launch.rendezvous import meet_nodes

    port = free_port()
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("", port))
    squatter.listen(8)

    def hang_up_on_everyone(until: float) -> None:  # what a store does with a greeting it cannot read
        squatter.settimeout(0.2)
        while time.monotonic() < until:
            try:
                conn, _ = squatter.accept()
                conn.close()
            except OSError:
                pass
        squatter.close()

    threading.Thread(target=hang_up_on_everyone, args=(time.monotonic() + 1.5,), daemon=True).start()
    joined = []
    node1 = threading.Thread(target=lambda: joined.append(meet_nodes("127.0.0.1", port, 2, 1, 20)))
    node1.start()
    time.sleep(2.0)  # the squatter is gone; node 0 now meets node 1
    meet_nodes("127.0.0.1", port, 2, 0, 20)
    node1.join(20)
    assert joined == [None]
