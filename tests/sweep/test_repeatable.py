"""A seeded Optuna sweep with trials side by side repeats itself: run twice, the second time with
its first trial held back so that its trials end in another order, it tries the same parameters,
prunes the same trials at the same steps and ends each trial on the same weights. Tiny 1-rank
CPU trials, 2 at a time. (What first-come scheduling would do under another end order:
tests/sweep/test_repeatable_source.py.)"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.clirunner import run_clorch_train, start_clorch_train
from tests.harness import processes_holding

pytestmark = pytest.mark.timeout(150)
ROOT = Path(__file__).resolve().parents[2]
SWEEP = [
    "+recipe=cpu_smoke",
    "launcher.nproc_per_node=1",
    "epochs=100",
    "max_steps=12",
    "eval_every=3",
    "hydra/sweeper=optuna",
    "optim.lr=tag(log, interval(1e-4, 3e-1))",
    "hydra.sweeper.n_trials=6",
    "hydra.sweeper.n_jobs=2",
    "hydra.sweeper.sampler.seed=3",
    "hydra.sweeper.pruner=median",
    "hydra.sweeper.min_trials=1",
]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _trials(sweep_dir: Path) -> list[tuple[str, str, str, str, str]]:
    """(number, optim.lr, status, pruned_at, weights_sha256) of each trial."""
    with open(sweep_dir / "sweep_summary.csv") as f:
        rows = list(csv.DictReader(f))
    digests = [json.loads((sweep_dir / r["job"] / "summary.json").read_text())["weights_sha256"] for r in rows]
    return [(r["job"], r["optim.lr"], r["status"], r["pruned_at"], d) for r, d in zip(rows, digests, strict=True)]


def _hold_back(run_dir: Path, seconds: float, proc) -> None:
    """Stop the ranks of the trial in `run_dir` for `seconds` once they start (SIGSTOP, SIGCONT)."""
    deadline = time.monotonic() + 60
    while not (pids := processes_holding(run_dir / "metrics.jsonl")):
        assert proc.poll() is None and time.monotonic() < deadline, "trial 0's rank never started"
        time.sleep(0.05)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def _ends(stdout: str) -> list[str]:
    return re.findall(r"clorch-train: trial (\d+) (?:succeeded|pruned)", stdout)


def test_a_seeded_sweep_side_by_side_repeats_its_trials_prunes_and_weights(tmp_path):
    first = run_clorch_train(["-m", *SWEEP, f"hydra.sweep.dir={tmp_path / 'a'}"], tmp_path, env=_env(), timeout=100)
    assert first.returncode == 0, first.stdout + first.stderr

    proc = start_clorch_train(["-m", *SWEEP, f"hydra.sweep.dir={tmp_path / 'b'}"], tmp_path, env=_env())
    _hold_back(tmp_path / "b" / "0", 6.0, proc)
    stdout, stderr = proc.communicate(timeout=100)
    assert proc.returncode == 0, stdout + stderr
    assert _ends(stdout).index("1") < _ends(stdout).index("0"), "trial 1 ends first while trial 0 is held back"

    a, b = _trials(tmp_path / "a"), _trials(tmp_path / "b")
    assert a == b
    assert len(a) == 6 and {t[2] for t in a} == {"succeeded", "pruned"}, a
