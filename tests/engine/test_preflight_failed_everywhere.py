"""A failed preflight is one truth in every entry mode: exit 1 on every node, the failing ranks
and hosts on each node's console, never "succeeded", preflight_failed in summary.json, in a
sweep's summary and as a failed run for `clorch-runs ls --status failed`.

One test starts every mode at once (CI's budget: the ranks start side by side): a single run,
a sweep (-m), `launcher=torchrun` on two nodes, torchrun and srun running `clorch-train` as
their ranks (two torchrun agents on loopback stand in for two nodes), and `clorch.run_local`
in this process. No job passes every check of a preflight whose deadline is 1 ms
(as in tests/preflight/test_clorch_train.py).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import clorch
from clorch.env import with_multicast_off
from tests.harness import free_port
from clorch.runs.cli import run_cli
from clorch.status import Status
from tests.clirunner import start_clorch_train

pytestmark = pytest.mark.timeout(420)
ROOT = Path(__file__).resolve().parents[2]
CLORCH_TRAIN = str(Path(sys.executable).parent / "clorch-train")
FAILING = [
    "+recipe=cpu_smoke",
    "data.sample_count=64",
    "logger.progress=off",
    "preflight=true",
    "preflight.timeout_s=0.001",
]
# A failing rank and its host ("host unknown": a rank that never arrived to say it).
WHO = re.compile(r"  - rank \d+ .*(on host \S+|\(host [^)]+\))")
FAILED = Status.PREFLIGHT_FAILED


def _env(**extra: str) -> dict[str, str]:
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in names and not k.startswith(("SLURM_", "TORCHELASTIC_", "CLORCH_"))
    }
    return with_multicast_off({**env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **extra})


def _popen(command: list[str], cwd: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        command, cwd=cwd, env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _start_all(tmp: Path) -> dict[str, list]:
    """Every outside-process mode, started; {mode: [its processes (one per node or task)]}."""
    port, agents = free_port(), free_port()
    torchrun = [
        sys.executable,
        "-m",
        "clorch.cli",
        *FAILING,
        "launcher=torchrun",
        "launcher.nnodes=2",
        "launcher.nproc_per_node=1",
        f"launcher.rdzv_endpoint=127.0.0.1:{free_port()}",
        "launcher.rdzv_id=pf",
        f"hydra.run.dir={tmp / 'launcher_torchrun'}",
    ]
    agent = [
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
        f"127.0.0.1:{agents}",
        "--rdzv-id",
        "pf",
        "--rdzv-conf",
        "join_timeout=60",
        "--no-python",
        CLORCH_TRAIN,
        *FAILING,
        f"hydra.run.dir={tmp / 'torchrun'}",
    ]
    slurm = {
        "SLURM_NTASKS": "2",
        "SLURM_NNODES": "1",
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NODELIST": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    return {
        "single": [start_clorch_train([*FAILING, f"hydra.run.dir={tmp / 'single'}"], tmp)],
        "sweep": [start_clorch_train(["-m", *FAILING, "seed=1", f"hydra.sweep.dir={tmp / 'sweep'}"], tmp)],
        "launcher=torchrun": [_popen(torchrun, tmp) for _ in range(2)],
        "torchrun": [_popen(agent, tmp, TMPDIR=str(tmp)) for _ in range(2)],
        "srun": [
            _popen(
                [CLORCH_TRAIN, *FAILING, f"hydra.run.dir={tmp / 'srun'}"],
                tmp,
                SLURM_PROCID=str(task),
                SLURM_LOCALID=str(task),
                **slurm,
            )
            for task in range(2)
        ],
    }


def _finish(procs: list) -> list[tuple[int, str]]:
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        out.append((proc.returncode, stdout + (stderr or "")))
    return out


def test_a_failed_preflight_exits_1_on_every_node_in_every_entry_mode(tmp_path):
    started = _start_all(tmp_path)
    local = clorch.run_local(
        recipe="cpu_smoke",
        run_dir=tmp_path / "run_local",
        sample_count=64,
        **{"preflight.mode": "true", "preflight.timeout_s": 0.001},
    )
    ended = {mode: _finish(procs) for mode, procs in started.items()}

    # The Python API: the result says it, with the exit code a command line would give.
    assert local.status is FAILED and local.status.exit_code == 1 and local["summary"]["status"] == FAILED
    assert local.summary.preflight is not None and not local.summary.preflight.passed

    for mode, nodes in ended.items():
        for node, (code, console) in enumerate(nodes):
            where = f"{mode}, node or task {node}:\n{console[-4000:]}"
            assert code == FAILED.exit_code == 1, where
            assert "succeeded" not in console, where
            if mode == "srun" and node == 1:
                continue  # the second task of one node: its node's first task speaks for it
            assert FAILED.line() in console and WHO.search(console), where

    for run in ("single", "sweep/0", "launcher_torchrun", "torchrun", "srun"):
        summary = json.loads((tmp_path / run / "summary.json").read_text())
        assert summary["status"] == "preflight_failed" and summary["steps"] == 0, run
    with open(tmp_path / "sweep" / "sweep_summary.csv") as f:
        assert [row["status"] for row in csv.DictReader(f)] == ["preflight_failed"]

    # clorch-runs counts each as a failed run.
    listed = io.StringIO()
    with contextlib.redirect_stdout(listed):
        assert run_cli(["ls", "--root", str(tmp_path), "--status", "failed", "--json"]) == 0
    dirs = sorted(Path(r["dir"]).relative_to(tmp_path).as_posix() for r in json.loads(listed.getvalue()))
    assert dirs == ["launcher_torchrun", "run_local", "single", "srun", "sweep/0", "torchrun"]
