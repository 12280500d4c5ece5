"""Two torchrun agents as two "nodes" on loopback (c10d rendezvous, one rank each) running
`clorch-train` as their ranks: the job trains like one node's 2 ranks, and a rank failing on
one node ends the other node's rank."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clorch.env import with_multicast_off
from tests.harness import free_port

pytestmark = pytest.mark.timeout(240)
ROOT = Path(__file__).resolve().parents[2]
TINY = ["+recipe=cpu_smoke", "data.sample_count=64", "log_every=1"]  # two nodes: the preflight runs first, by default


def _agent(
    port: int, run_id: str, entry: list[str], args: list[str], cwd: Path, local_addr: str | None = None
) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        run_id,
        "--rdzv-conf",
        "join_timeout=60",
        *(["--local-addr", local_addr] if local_addr else []),
        *entry,
        *args,
    ]
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in names and not k.startswith(("SLURM_", "TORCHELASTIC_", "CLORCH_"))
    }
    env = with_multicast_off(
        {**env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TMPDIR": str(cwd), "CLORCH_TESTS_FAIL_AT_STEP": "2"}
    )
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _clorch_train() -> list[str]:
    return ["--no-python", str(Path(sys.executable).parent / "clorch-train")]


def _finish(agents: list[subprocess.Popen]) -> list[tuple[int, str]]:
    out = []
    for agent in agents:
        stdout, stderr = agent.communicate(timeout=180)
        out.append((agent.returncode, stdout + stderr))
    return out


def test_two_agents_train_like_one_node_with_two_ranks(tmp_path, local_run):
    port, run_dir = free_port(), tmp_path / "run"
    args = [*TINY, f"hydra.run.dir={run_dir}"]
    agents = [_agent(port, "two", _clorch_train(), args, tmp_path) for _ in range(2)]
    (code0, out0), (code1, out1) = _finish(agents)
    assert code0 == code1 == 0, out0[-3000:] + out1[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["world_size"] == 2
    assert summary["launcher"] == "torchrun"
    assert json.loads((run_dir / "env.json").read_text())["launcher"] == "torchrun"
    local = local_run(recipe="cpu_smoke", sample_count=64, log_every=1, progress="off")  # shared (test_external)
    assert local["summary"]["weights_sha256"] == summary["weights_sha256"]


def test_a_rank_failing_on_one_node_ends_the_other_nodes_rank(tmp_path):
    port, run_dir = free_port(), tmp_path / "run"
    args = [*TINY, f"hydra.run.dir={run_dir}", "data.sample_count=256", "epochs=20"]
    start = time.monotonic()
    healthy = _agent(port, "fail", _clorch_train(), args, tmp_path)
    failing = _agent(port, "fail", [str(ROOT / "tests" / "launch" / "failing_rank.py")], args, tmp_path)
    (healthy_code, healthy_out), (failing_code, failing_out) = _finish([healthy, failing])
    assert failing_code != 0 and "exiting on purpose after step 2" in failing_out, failing_out[-3000:]
    assert healthy_code != 0, healthy_out[-3000:]  # ended by the failure, long before its 160 steps
    assert time.monotonic() - start < 120
    assert "ChildFailedError" in failing_out or "exitcode" in failing_out
    # The healthy node's rank saw its peer go (the failing rank left no record) and says so.
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "another rank ended first" in summary["error"]["message"]
    assert "clorch-train: job failed: RuntimeError: another rank ended first" in healthy_out


def _rank_of(agent: subprocess.Popen, timeout: float = 60.0) -> int:
    """The pid of the rank an agent started (its one child process)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = Path(f"/proc/{agent.pid}/task/{agent.pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.2)
    raise AssertionError(f"agent {agent.pid} started no rank within {timeout} s")


def _wait_for_training(run_dir: Path, timeout: float = 120.0) -> None:
    """Until rank 0 has logged a few training steps (both ranks are then in the loop)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if (run_dir / "metrics.jsonl").read_text().count('"step"') >= 3:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"the job in {run_dir} logged no training step within {timeout} s")


@pytest.mark.parametrize("killed", [0, 1], ids=["store-host-node", "other-node"])
def test_a_node_whose_rank_is_killed_ends_the_job_within_30_s(tmp_path, killed):
    """SIGKILL leaves no record and no clean socket shutdown: the surviving node's rank must still
    notice (its next collective fails), end, and its agent exit, well inside 30 s."""
    port, run_dir = free_port(), tmp_path / "run"
    args = [*TINY, f"hydra.run.dir={run_dir}", "data.sample_count=256", "epochs=3000", "log_every=10"]
    agents = [_agent(port, "kill", _clorch_train(), args, tmp_path) for _ in range(2)]
    try:
        _wait_for_training(run_dir)
        victim, survivor = agents[killed], agents[1 - killed]
        os.kill(_rank_of(victim), signal.SIGKILL)
        killed_at = time.monotonic()
        survivor.wait(timeout=60)
        assert time.monotonic() - killed_at < 30, "the surviving node's agent took 30 s or more to exit"
        assert survivor.returncode != 0
        victim.wait(timeout=30)
    finally:
        for agent in agents:  # a hung job: its ranks first, then the agent
            if agent.poll() is None:
                for pid in Path(f"/proc/{agent.pid}/task/{agent.pid}/children").read_text().split():
                    os.kill(int(pid), signal.SIGKILL)
                agent.kill()
        _finish(agents)


def _wait_for_listener(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"nothing listens on port {port} after {timeout} s")


def test_a_node_lost_during_start_up_ends_the_job_within_60_s(tmp_path):
    """Rank 0's node dies before the other node's rank has joined: its agent, which hosts the ranks'
    store, is gone when that rank connects. The surviving node's agent (the rendezvous endpoint's
    host, so its own rendezvous never fails) waits for its rank alone: the rank must give up on the
    store within seconds, not retry its connection for the collective timeout (200 s here). The
    60 s also cover the rank's own start (composing, checking) after the loss."""
    port, run_dir = free_port(), tmp_path / "run"
    args = [*TINY, f"hydra.run.dir={run_dir}", "epochs=3000", "launcher.collective_timeout=200"]
    entry = [str(ROOT / "tests" / "launch" / "late_rank.py")]
    # The first agent hosts the rendezvous endpoint; group rank 0 (the ranks' store host) is the
    # node whose address sorts first: 127.0.0.1 before localhost.
    survivor = _agent(port, "lost", entry, args, tmp_path, local_addr="localhost")
    agents = [survivor]
    try:
        _wait_for_listener(port)
        victim = _agent(port, "lost", entry, args, tmp_path, local_addr="127.0.0.1")
        agents.append(victim)
        victim.wait(timeout=120)
        lost_at = time.monotonic()
        survivor.wait(timeout=90)
        assert time.monotonic() - lost_at < 60, "the surviving node's agent took 60 s or more to exit"
        assert survivor.returncode != 0
    finally:
        for agent in agents:  # a hung job: its ranks first, then the agent
            if agent.poll() is None:
                for pid in Path(f"/proc/{agent.pid}/task/{agent.pid}/children").read_text().split():
                    os.kill(int(pid), signal.SIGKILL)
                agent.kill()
        outputs = _finish(agents)
    assert "that node has gone" in outputs[0][1], outputs[0][1][-3000:]
    victim_out = outputs[1][1]
    assert "exitcode  : -9" in victim_out and "rank      : 0" in victim_out, victim_out[-3000:]  # rank 0 was lost
