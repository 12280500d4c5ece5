"""launcher=torchrun: torch's elastic agent runs the ranks (CPU, gloo), for one node and for two
nodes on this machine; nodes that never arrive end the run within the rendezvous timeout."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import clorch

pytestmark = pytest.mark.timeout(240)


def _endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_one_node_trains_like_the_local_launcher(tmp_path):
    torchrun = clorch.run_local(recipe="cpu_smoke", run_dir=tmp_path / "t", sample_count=64,
                                **{"launcher": "torchrun", "launcher.rdzv_endpoint": _endpoint()})
    assert torchrun["status"]["state"] == "succeeded", torchrun
    summary = torchrun["summary"]
    assert summary["launcher"] == "torchrun" and summary["steps"] == 2 and summary["weights_sha256"]
    local = clorch.run_local(recipe="cpu_smoke", run_dir=tmp_path / "l", sample_count=64)
    assert local["summary"]["final"]["loss"] == pytest.approx(summary["final"]["loss"], rel=1e-6)


def test_two_nodes_meet_at_the_endpoint(tmp_path):
    endpoint, run_dir = _endpoint(), tmp_path / "run"
    command = [str(Path(sys.executable).parent / "clorch-train"), "+recipe=cpu_smoke", "launcher=torchrun",
               "launcher.nnodes=2", "launcher.nproc_per_node=1", f"launcher.rdzv_endpoint={endpoint}",
               "launcher.rdzv_timeout=60", "data.sample_count=64", f"hydra.run.dir={run_dir}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "SLURM_"))}
    nodes = [subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [node.communicate(timeout=200) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outs
    assert json.loads((run_dir / "summary.json").read_text())["world_size"] in (1, 2)
    assert "world_size" in (run_dir / "env.json").read_text()


def test_missing_nodes_end_the_run_within_the_timeout(tmp_path):
    start = time.monotonic()
    result = clorch.run_local(recipe="cpu_smoke", run_dir=tmp_path / "run",
                              **{"launcher": "torchrun", "launcher.nnodes": "2:2",
                                 "launcher.rdzv_timeout": 3, "launcher.rdzv_endpoint": _endpoint()})
    assert time.monotonic() - start < 60
    assert result["status"]["state"] == "failed"
    message = result["summary"]["error"]["message"]
    assert "did not meet at launcher.rdzv_endpoint=127.0.0.1:" in message
    assert "launcher.nnodes=2:2 needs 2 node(s)" in message and "rdzv_timeout=3 s" in message
