"""A sweep's one-rank trial trains in its own forked process (clorch.engine.in_process), and is
still the run `clorch-train` alone would make of its overrides: the same weights, the same files."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.clirunner import run_clorch_train, start_clorch_train
from tests.harness import processes_holding

TRIAL = ["+recipe=cpu_smoke", "launcher.nproc_per_node=1", "max_steps=3", "data.sample_count=32"]


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.timeout(240)
def test_a_one_rank_trial_trains_in_its_own_process_to_a_lone_runs_weights(tmp_path):
    sweep_dir, alone = tmp_path / "sweep", tmp_path / "alone"
    # A grid of two learning rates, one trial at a time.
    swept = run_clorch_train(["-m", *TRIAL, "optim.lr=0.01,0.02", f"hydra.sweep.dir={sweep_dir}"], tmp_path)
    single = run_clorch_train([*TRIAL, "optim.lr=0.01", f"hydra.run.dir={alone}"], tmp_path)
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert single.returncode == 0, single.stdout + single.stderr

    trial = sweep_dir / "0"
    env = json.loads((trial / "env.json").read_text())
    assert env["launcher"] == "clorch"  # no launcher process: the trial's process was its rank
    assert not (trial / "logs").exists()
    assert _summary(trial)["weights_sha256"] == _summary(alone)["weights_sha256"]
    assert _summary(trial)["steps"] == 3 and _summary(trial)["status"] == "succeeded"
    assert (trial / "loss.png").is_file() and (trial / "metrics.jsonl").is_file()
    # Each trial is a run of its own, with its own line on the sweep's terminal.
    assert _summary(sweep_dir / "1")["status"] == "succeeded"
    assert swept.stdout.count("clorch-train: succeeded, 3 steps") == 2


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


@pytest.mark.timeout(180)
def test_a_killed_sweep_leaves_no_trial_training(tmp_path):
    sweep_dir = tmp_path / "sweep"
    args = ["-m", *TRIAL, "max_steps=100000", "epochs=100000", "optim.lr=0.01,0.02", f"hydra.sweep.dir={sweep_dir}"]
    proc = start_clorch_train(args, tmp_path)
    deadline = time.monotonic() + 90
    while not (trials := processes_holding(sweep_dir / "0" / "metrics.jsonl")):
        assert proc.poll() is None and time.monotonic() < deadline, "the trial never started training"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)  # the sweep gets no say
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 30
    while not all(_gone(pid) for pid in trials):
        assert time.monotonic() < deadline, f"trial processes {trials} still train after their sweep was killed"
        time.sleep(0.1)
    assert _summary(sweep_dir / "0")["status"] == "interrupted"  # continuing the sweep resumes it
