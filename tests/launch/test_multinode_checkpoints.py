"""The README's multi-node command (`launcher=torchrun`, `checkpoint=periodic`) as two nodes on
loopback sharing one run directory: the nodes of one job share the checkpoint directory's lock
and resume from its checkpoints; a node of another job is refused and leaves the running job's
files alone; a node whose peer never comes ends in words, at its timeout or at Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from tests.harness import free_port
from tests.clirunner import start_clorch_train

pytestmark = pytest.mark.timeout(180)
NODE = [
    "+recipe=cpu_smoke",
    "data.sample_count=64",
    "launcher=torchrun",
    "launcher.nnodes=2",
    "launcher.nproc_per_node=1",
    "launcher.max_restarts=1",
    "checkpoint=periodic",
    "checkpoint.every_n_steps=1",
]  # two nodes: the preflight runs first, by default


def _node(cwd: Path, port: int, rdzv_id: str, run_dir: Path, *extra: str):
    """One node: `clorch-train` with the README's multi-node settings, as its own process."""
    args = [
        *NODE,
        f"launcher.rdzv_endpoint=127.0.0.1:{port}",
        f"launcher.rdzv_id={rdzv_id}",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]
    return start_clorch_train(args, cwd, env={**os.environ, "OMP_NUM_THREADS": "1"})


def _finish(nodes) -> list[tuple[int, str]]:
    out = []
    for node in nodes:
        stdout, stderr = node.communicate(timeout=150)
        out.append((node.returncode, stdout + stderr))
    return out


def _holds_lock(run_dir: Path, rdzv_id: str, node) -> None:
    """Wait until `node` holds the checkpoint directory (its job id is in the lock file)."""
    lock = run_dir / "checkpoints" / ".clorch-run.lock"
    while f"rdzv_id={rdzv_id} " not in (lock.read_text() if lock.exists() else ""):
        assert node.poll() is None, node.communicate(1)
        time.sleep(0.2)


def test_two_nodes_of_one_job_share_the_checkpoints_and_both_resume_from_them(tmp_path):
    run_dir = tmp_path / "run"
    port = free_port()
    first = _node(tmp_path, port, "job", run_dir)
    time.sleep(1.5)  # the second node starts while the first holds the checkpoint directory
    second = _node(tmp_path, port, "job", run_dir)
    (code1, out1), (code2, out2) = _finish([first, second])
    assert code1 == code2 == 0, out1[-3000:] + out2[-3000:]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*.ckpt")) == [
        "step_00000001.ckpt",
        "step_00000002.ckpt",
    ]
    assert json.loads((run_dir / "summary.json").read_text())["world_size"] == 2

    # The pair again, started together, one epoch more: both nodes resume from the checkpoint.
    port = free_port()
    again = [
        _node(
            tmp_path,
            port,
            "job2",
            run_dir,
            "epochs=2",
            f"checkpoint.dir={run_dir / 'checkpoints'}",
            "checkpoint.resume=latest",
        )
        for _ in range(2)
    ]
    (code1, out1), (code2, out2) = _finish(again)
    assert code1 == code2 == 0, out1[-3000:] + out2[-3000:]
    # Every rank restores the checkpoint the ranks agreed on (a collective), so the job's two steps
    # after step 2 ran on both nodes from the checkpoint the first pair left.
    events = (run_dir / "events.jsonl").read_text()
    assert f"resuming from {run_dir / 'checkpoints' / 'step_00000002.ckpt'} at step 2" in events
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["steps"] == 4 and summary["world_size"] == 2
    assert summary["resumed_from"].endswith("step_00000002.ckpt")
    steps = [
        r["step"]
        for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
        if r.get("kind") == "train"
    ]
    assert steps[-1] == 4, steps


def test_a_node_of_another_job_is_refused_and_leaves_the_running_jobs_files(tmp_path):
    run_dir, port = tmp_path / "run", free_port()
    first = _node(tmp_path, port, "one", run_dir, "launcher.rdzv_timeout=120")
    _holds_lock(run_dir, "one", first)
    before = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))
    intruder = _node(tmp_path, free_port(), "two", run_dir)
    [(code, out)] = _finish([intruder])
    assert code == 2, out[-3000:]
    assert f"checkpoint directory {run_dir / 'checkpoints'} is in use by another run (pid " in out
    assert "job torchrun rdzv_id=one at 127.0.0.1:" in out and "this run is job torchrun rdzv_id=two" in out
    assert f"left {run_dir} as it was: another process is using it" in out
    assert all((run_dir / name).exists() for name in before), "the running job's files are intact"
    # The running job's own second node arrives: the job trains in the directory it kept.
    second = _node(tmp_path, port, "one", run_dir)
    (code1, out1), (code2, out2) = _finish([first, second])
    assert code1 == code2 == 0, out1[-3000:] + out2[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "succeeded"


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """(its working directory, a node whose peer never comes: launcher.rdzv_timeout=3). Started by
    the Ctrl-C test before its own node, so that this one's start and wait overlap that test's."""
    tmp_path = tmp_path_factory.mktemp("alone")
    node = _node(tmp_path, free_port(), "alone", tmp_path / "run", "launcher.rdzv_timeout=3")
    yield tmp_path, node
    if node.poll() is None:
        node.send_signal(signal.SIGKILL)  # a test failed before finishing it
        node.communicate(30)


@pytest.mark.usefixtures("alone")  # started first: the peer-never-comes test finishes it
def test_ctrl_c_while_a_node_waits_for_its_peer_exits_130_with_the_interrupt_summary(tmp_path):
    run_dir, port = tmp_path / "run", free_port()
    node = _node(tmp_path, port, "waits", run_dir, "launcher.rdzv_timeout=120")
    _holds_lock(run_dir, "waits", node)
    while True:  # the agent waits once it serves the rendezvous store at the endpoint
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert node.poll() is None, node.communicate(1)
            time.sleep(0.2)
    start = time.monotonic()
    node.send_signal(signal.SIGINT)
    [(code, out)] = _finish([node])
    assert time.monotonic() - start < 60, "Ctrl-C ends the wait, not the rendezvous timeout"
    assert code == 130, out[-3000:]
    assert "clorch-train: interrupted by SIGINT after step 0 of 2; the ranks were stopped" in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"


def test_a_node_whose_peer_never_comes_ends_at_the_timeout_in_words(alone):
    tmp_path, node = alone
    run_dir = tmp_path / "run"
    [(code, out)] = _finish([node])
    assert code == 1, out[-3000:]
    assert "did not meet at launcher.rdzv_endpoint=127.0.0.1:" in out
    assert "launcher.nnodes=2 needs 2 node(s); 1 node(s) joined" in out and "rdzv_timeout=3 s" in out
    assert "Traceback" not in out, out[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"
