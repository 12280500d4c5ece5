"""Two torchrun agents as two "nodes" on loopback (c10d rendezvous, one rank each) running
`clorch-train` as their ranks: the job trains like one node's 2 ranks, and a rank failing on
one node ends the other node's rank."""

from __future__ import annotations

import json
import os
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


def _agent(port: int, run_id: str, entry: list[str], args: list[str], cwd: Path) -> subprocess.Popen:
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
