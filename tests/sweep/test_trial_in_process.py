"""A sweep's one-rank trial trains in its own forked process (clorch.engine.in_process), and is
still the run `clorch-train` alone would make of its overrides: the same weights, the same files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.clirunner import run_clorch_train

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
