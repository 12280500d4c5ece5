"""launcher=torchrun: torch's elastic agent runs the ranks (CPU, gloo) on one node; nodes that
never arrive end the run within the rendezvous timeout."""

from __future__ import annotations

import socket
import time

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
