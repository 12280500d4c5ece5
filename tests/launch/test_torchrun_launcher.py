"""launcher=torchrun: torch's elastic agent runs the ranks (CPU, gloo) on one node; nodes that
never arrive end the run within the rendezvous timeout."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from base64 import b64encode
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

import clorch
from clorch.launch.torchrun import _JoinWatcher
from tests.harness import free_port

pytestmark = pytest.mark.timeout(240)
ROOT = Path(__file__).resolve().parents[2]


def _endpoint() -> str:
    return f"127.0.0.1:{free_port()}"


def test_one_node_trains_like_the_local_launcher(tmp_path, local_run):
    torchrun = clorch.run_local(
        recipe="cpu_smoke",
        run_dir=tmp_path / "t",
        sample_count=64,
        **{"launcher": "torchrun", "launcher.rdzv_endpoint": _endpoint()},
    )
    assert torchrun["status"]["state"] == "succeeded", torchrun
    summary = torchrun["summary"]
    assert summary["launcher"] == "torchrun" and summary["steps"] == 2 and summary["weights_sha256"]
    local = local_run(recipe="cpu_smoke", sample_count=64, progress="off")  # shared with the two-node test
    assert local["summary"]["final"]["loss"] == pytest.approx(summary["final"]["loss"], rel=1e-6)


def test_missing_nodes_end_the_run_within_the_timeout(tmp_path):
    start = time.monotonic()
    result = clorch.run_local(
        recipe="cpu_smoke",
        run_dir=tmp_path / "run",
        **{
            "launcher": "torchrun",
            "launcher.nnodes": "2:2",
            "launcher.rdzv_timeout": 3,
            "launcher.rdzv_endpoint": _endpoint(),
        },
    )
    assert time.monotonic() - start < 60
    assert result["status"]["state"] == "failed"
    message = result["summary"]["error"]["message"]
    assert "did not meet at launcher.rdzv_endpoint=127.0.0.1:" in message
    assert "launcher.nnodes=2:2 needs 2 node(s); 1 node(s) joined (" in message, message
    assert "rdzv_timeout=3 s" in message
    assert _running_with(str(tmp_path)) == [], "nothing of this run is left running"


def _running_with(text: str) -> list[int]:
    """Live processes whose command line mentions `text` (this test's run directory)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    cmdline = handle.read().decode(errors="replace")
                with open(f"/proc/{entry}/stat") as handle:
                    state = handle.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if text in cmdline and state != "Z":
                found.append(int(entry))
    return found


def _two_nodes(args: list[str], cwd: Path) -> list[str]:
    """Start `args` twice, as two nodes; both must exit 0. Returns their outputs."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    nodes = [
        subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    outputs = [node.communicate(timeout=200)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    # A healthy job prints no C++ stack trace (a store call after another node's store went away).
    assert not any("frame #" in out for out in outputs), outputs
    return outputs


def test_the_join_watcher_stops_once_the_nodes_met():
    """It reads the agents' rendezvous state while they wait, and no longer once all have joined:
    the store's host may be another node, which may end first."""
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    state = _RendezvousState()
    watcher = _JoinWatcher(f"127.0.0.1:{port}", "met", needed=2)
    watcher.start()
    for pid in (11, 12):
        state.participants[_NodeDesc("node-a", pid, 0)] = len(state.participants)
        store.set("torch.rendezvous.met", b64encode(pickle.dumps(state)))
        time.sleep(1.2)
    watcher.join(5)
    assert not watcher.is_alive() and watcher.joined == ["node-a (pid 11)", "node-a (pid 12)"]
    assert watcher.describe() == "2 node(s) joined (node-a (pid 11), node-a (pid 12))"


def test_two_nodes_on_loopback_train_like_one_node(tmp_path, local_run):
    """Two `clorch-train launcher=torchrun` processes as two nodes, one rank each, sharing a run directory."""
    run_dir = tmp_path / "run"
    args = [
        sys.executable,
        "-m",
        "clorch.cli",
        "+recipe=cpu_smoke",
        "data.sample_count=64",
        "launcher=torchrun",
        "launcher.nnodes=2",
        "launcher.nproc_per_node=1",
        f"launcher.rdzv_endpoint={_endpoint()}",
        "launcher.rdzv_id=two",
        f"hydra.run.dir={run_dir}",
    ]  # two nodes: the preflight runs first, by default
    _two_nodes(args, tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["launcher"] == "torchrun"
    local = local_run(recipe="cpu_smoke", sample_count=64, progress="off")
    assert local["summary"]["weights_sha256"] == summary["weights_sha256"]


def test_two_nodes_run_preflight_only_and_check_each_other(tmp_path):
    """Two `launcher=torchrun` agents as two nodes: the preflight runs in the job's own ranks."""
    run_dir = tmp_path / "run"
    args = [
        sys.executable,
        "-m",
        "clorch.cli",
        "+recipe=cpu_smoke",
        "launcher=torchrun",
        "launcher.nnodes=2",
        "launcher.nproc_per_node=1",
        f"launcher.rdzv_endpoint={_endpoint()}",
        "launcher.rdzv_id=pf",
        f"hydra.run.dir={run_dir}",
        "preflight=only",
    ]  # the default comparison, on one busy machine
    outputs = _two_nodes(args, tmp_path)
    record = json.loads((run_dir / "preflight.json").read_text())
    assert record["passed"] and [row["rank"] for row in record["ranks"]] == [0, 1]
    assert "preflight passed on 2 rank(s)" in "".join(outputs)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 0 and summary["preflight"]["passed"]


_LOST_STORE = """
import os, sys, time, datetime
from clorch.launch.torchrun import quiet_cpp_warnings, ranks_environ
quiet_cpp_warnings()
import torch.distributed as dist
port = int(sys.argv[1])
host = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=2))
del host  # the server goes, as another node's agent's store does at the end of a job
for _ in range(2):
    try:
        client.check(["x"])
    except Exception as exc:
        print(type(exc).__name__)
print("TORCH_CPP_LOG_LEVEL" in ranks_environ(dict(os.environ)))
"""


def test_the_launching_process_prints_no_cpp_stack_trace_of_a_store_gone():
    """A store call after the store's host ended (the agents' teardown at the end of a multi-node
    job): torch logs its error with a C++ stack trace unless its C++ log level is ERROR; the
    ranks keep the user's level."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CPP_LOG_LEVEL"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", _LOST_STORE, str(free_port())], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "DistNetworkError" in done.stdout and done.stdout.endswith("False\n"), done.stdout
    assert "frame #" not in done.stderr, done.stderr
