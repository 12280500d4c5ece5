"""`hydra.sweeper.pruner=asha`: trials pause at rungs with a checkpoint and are promoted to continue
bit for bit; a sweep killed and continued makes the same promotions; its keys are checked before
the first trial. One tiny 1-rank CPU sweep (module-scoped) serves the end-to-end tests; ASHA's
rule itself is tested in-process on hand-made trials."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from omegaconf import OmegaConf

from clorch.sweep.checks import _pruning_errors, read_sweep
from clorch.train import asha
from tests.clirunner import run_clorch_train, start_clorch_train

pytestmark = pytest.mark.timeout(240)
ROOT = Path(__file__).resolve().parents[2]
# lr 0.02 trains well in 8 steps, 1e-3 and 2e-3 barely: trial 1 pauses at its first rung behind
# trial 0, and ASHA promotes trial 0 (paused at step 2 as the rung's only result) when there is room;
# trial 0 pauses again at step 4 (alone there), trial 2 at step 2, and with nothing else to run the
# sweep promotes trial 0 from step 4 to its end.
SWEEP = [
    "+recipe=cpu_smoke",
    "launcher.nproc_per_node=1",
    "max_steps=8",
    "eval_every=2",
    "hydra/sweeper=optuna",
    "optim.lr=tag(log, interval(1e-3, 1e-1))",
    "hydra.sweeper.n_trials=3",
    "hydra.sweeper.sampler.seed=0",
    "hydra.sweeper.enqueue=[{optim.lr: 0.02}, {optim.lr: 0.001}, {optim.lr: 0.002}]",
    "hydra.sweeper.pruner=asha",
    "hydra.sweeper.pruner.min_resource=2",
    "hydra.sweeper.pruner.reduction_factor=2",
]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _record(sweep_dir: Path) -> list[tuple]:
    """(number, state, ASHA's record, status in summary.json, weights) of every trial."""
    study = optuna.load_study(study_name=sweep_dir.name, storage=f"sqlite:///{sweep_dir / 'optuna.db'}")
    return [
        (
            t.number,
            t.state.name,
            t.user_attrs.get(asha.ATTR),
            _summary(sweep_dir / str(t.number))["status"],
            _summary(sweep_dir / str(t.number))["weights_sha256"],
        )
        for t in study.trials
    ]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("asha")
    done = run_clorch_train(["-m", *SWEEP, f"hydra.sweep.dir={tmp / 'whole'}"], tmp, env=_env(), timeout=200)
    assert done.returncode == 0, done.stdout + done.stderr
    return tmp, done


def test_asha_pauses_trials_at_rungs_with_a_checkpoint_and_promotes_them_to_continue(swept):
    tmp, done = swept
    whole = tmp / "whole"
    records = _record(whole)
    assert "trial 0 promoted from step 2" in done.stdout
    assert "paused at step 2 of 8 by the sweep's ASHA pruner" in done.stdout
    states = {number: (state, mark, status) for number, state, mark, status, _ in records}
    assert states[1] == ("PRUNED", {"paused_at": 2, "promoted": []}, "paused")  # never promoted: kept paused
    assert states[2] == ("PRUNED", {"paused_at": 2, "promoted": []}, "paused")
    assert states[0] == ("COMPLETE", {"paused_at": None, "promoted": [2, 4]}, "succeeded")
    assert "trial 0 promoted from step 4 (the best paused trial" in done.stdout
    assert _summary(whole / "0")["resumed_from"].endswith("step_00000004.ckpt")
    # A paused trial's checkpoint is written whatever the policy (none here), and its row says where it stopped.
    assert list((whole / "1" / "checkpoints").glob("step_00000002.*"))
    rows = (whole / "sweep_summary.csv").read_text().splitlines()
    assert any(",paused," in row and ",2,2," in row for row in rows), rows


def test_the_best_trials_rerun_command_straight_through_ends_on_its_weights(swept):
    tmp, done = swept
    best = re.search(r"best trial (\d+):", done.stdout).group(1)
    command = re.search(r"rerun it with: (clorch-train .*)", done.stdout).group(1)
    straight = tmp / "straight"
    again = run_clorch_train([*shlex.split(command)[1:], f"hydra.run.dir={straight}"], tmp, env=_env(), timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    paused_once = _summary(tmp / "whole" / best)
    assert paused_once["status"] == "succeeded" and paused_once["steps"] == 8
    assert _summary(straight)["weights_sha256"] == paused_once["weights_sha256"]


def _resuming(run_dir: Path) -> bool:
    events = run_dir / "events.jsonl"
    return events.exists() and "resuming from" in events.read_text()


def test_a_sweep_killed_mid_run_and_continued_makes_the_same_promotions(swept):
    tmp, _ = swept
    parts = tmp / "parts"
    args = ["-m", *SWEEP, f"hydra.sweep.dir={parts}"]
    proc = start_clorch_train(args, tmp, env=_env())
    deadline = time.monotonic() + 150
    while not _resuming(parts / "0"):  # trials 0 and 1 paused; trial 0, promoted, trains on from step 2
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)  # its trial's rank dies with it (PR_SET_PDEATHSIG)
    proc.communicate(timeout=60)
    again = run_clorch_train(args, tmp, env=_env(), timeout=200)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "paused by ASHA, kept for promotion; 1 cut off, run again" in again.stdout
    assert _record(parts) == _record(tmp / "whole")


# -- the keys, before the first trial ---------------------------------------------------------


def _errors(*overrides: str) -> list[str]:
    return read_sweep(["hydra/sweeper=optuna", "optim.lr=interval(1e-4, 1e-1)", *overrides])[1]


def test_asha_keys_are_checked_by_name_type_and_bound_before_the_first_trial():
    assert _errors("hydra.sweeper.pruner=asha", "hydra.sweeper.pruner.min_resource=4") == []
    assert _errors("hydra.sweeper.pruner=asha", "hydra.sweeper.pruner.reduction_factor=1") == [
        "hydra.sweeper.pruner.reduction_factor must be an integer >= 2, got 1"
    ]
    assert _errors("hydra.sweeper.pruner=asha", "hydra.sweeper.pruner.min_resource=0") == [
        "hydra.sweeper.pruner.min_resource must be an integer >= 1, got 0"
    ]
    (wrong,) = _errors("hydra.sweeper.pruner=asha", "hydra.sweeper.pruner.n_warmup_steps=3")
    assert "belongs to the median pruner" in wrong and "asha takes min_resource, reduction_factor" in wrong
    (several,) = _errors(
        "hydra.sweeper.pruner=asha",
        "hydra.sweeper.objective=[eval_loss,loss]",
        "hydra.sweeper.direction=[minimize,minimize]",
    )
    assert "cannot prune a sweep of several objectives" in several
    (side_by_side,) = _errors("hydra.sweeper.pruner=asha", "hydra.sweeper.n_jobs=2", "hydra.sweeper.sampler.seed=1")
    assert "set hydra.sweeper.repeatable=false, or n_jobs=1" in side_by_side
    assert _errors("hydra.sweeper.pruner=asha", "hydra.sweeper.n_jobs=2", "hydra.sweeper.repeatable=false") == []


def test_asha_refuses_rungs_that_are_not_evals_naming_the_fix():
    def errors(**base) -> list[str]:
        sweep, _ = read_sweep(["hydra/sweeper=optuna", "optim.lr=interval(1e-4, 1e-1)", *_asha_args(base)])
        return _pruning_errors(sweep.settings, OmegaConf.create({k: v for k, v in base.items() if k != "first"}))

    assert errors(eval_every=2, max_steps=8, first=4) == []
    (off_cadence,) = errors(eval_every=4, max_steps=40, first=6)
    assert off_cadence.startswith("hydra.sweeper.pruner.min_resource=6 is not a multiple of eval_every=4")
    assert "set min_resource to 4 or 8" in off_cadence
    (too_late,) = errors(eval_every=2, max_steps=8, first=8)
    assert "is not below max_steps=8" in too_late
    (no_evals,) = errors(eval_every=0, max_steps=8, first=2)
    assert "evaluate only at the end (eval_every=0)" in no_evals


def _asha_args(base: dict) -> list[str]:
    return ["hydra.sweeper.pruner=asha", f"hydra.sweeper.pruner.min_resource={base['first']}"]


# -- ASHA's rule, on hand-made trials ---------------------------------------------------------


@dataclass
class _Trial:
    number: int
    values: dict[int, float]
    mark: dict | None = None
    state: str = "RUNNING"
    user_attrs: dict = field(init=False)

    def __post_init__(self) -> None:
        self.intermediate_values = self.values
        self.user_attrs = {} if self.mark is None else {asha.ATTR: self.mark}
        self.state = SimpleNamespace(name=self.state)


def test_rungs_and_the_default_first_rung():
    assert asha.ladder(2, 2, 8, 2) == [2, 4]
    assert asha.ladder(None, 3, 90, 5) == [10, 30]  # 90 / 3^2, a multiple of eval_every
    assert asha.ladder(None, 3, 27, 4) == [4, 12]  # 27 / 9 = 3, up to one eval
    assert asha.ladder(8, 3, 8, 1) == []


def test_promotion_takes_the_highest_rung_first_and_only_the_best_1_over_rf_not_yet_promoted():
    paused = lambda step: {"paused_at": step, "promoted": [2] if step == 4 else []}  # noqa: E731
    trials = [
        _Trial(0, {2: 0.5, 4: 0.4}, paused(4)),
        _Trial(1, {2: 0.6}, paused(2)),
        _Trial(2, {2: 0.9}, paused(2)),
        _Trial(3, {2: 0.1, 4: 0.3}, {"paused_at": None, "promoted": [2, 4]}),
    ]
    assert asha.promotion(trials, 2, maximize=False) is None  # rung 4: trial 3 went on; rung 2: 0 and 3
    trials.append(_Trial(4, {2: 0.7, 4: 0.2, 8: 0.1}, {"paused_at": None, "promoted": [2, 4]}, "COMPLETE"))
    trials.append(_Trial(5, {2: 0.95, 4: 0.35}, paused(4)))
    found, step = asha.promotion(trials, 2, maximize=False)  # rung 4: 4 results, best two 4 and 3; rung 2: 1
    assert (found.number, step) == (1, 2) and asha.promotion(trials, 2, maximize=True)[0].number == 0
    assert asha.closing_promotion(trials, maximize=False) is None  # trial 4 completed
    trials.pop(4)
    found, step = asha.closing_promotion(trials, maximize=False)
    assert (found.number, step) == (5, 4)


def test_a_trial_goes_on_at_a_rung_it_was_promoted_from_before():
    trials = [_Trial(0, {2: 0.1}, None), _Trial(1, {2: 0.9}, {"paused_at": 2, "promoted": [2]})]
    assert asha.goes_on(trials, 1, 2, 2, maximize=False)
    assert not asha.goes_on(trials[:1] + [_Trial(1, {2: 0.9})], 1, 2, 2, maximize=False)
    assert asha.goes_on(trials, 0, 2, 2, maximize=False)
