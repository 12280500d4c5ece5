"""What Optuna users reach for, by name: sampler and pruner arguments, a time budget, known-good
trials first, several objectives, and the best trial as a recipe file. Each key is checked before
the first trial (unit tests of clorch.sweep.settings and checks); a few tiny 1-rank sweeps run it."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from clorch.sweep.best import recipe_of
from clorch.sweep.checks import read_sweep
from tests.clirunner import run_clorch_train

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
TINY = ["+recipe=cpu_smoke", "launcher.nproc_per_node=1", "max_steps=2"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _errors(*overrides: str) -> list[str]:
    return read_sweep(["hydra/sweeper=optuna", "optim.lr=interval(1e-4, 1e-1)", *overrides])[1]


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


# -- the best trial as a recipe ---------------------------------------------------------------


def test_a_trials_recipe_puts_its_group_choices_before_its_values_on_the_sweeps_recipe():
    from clorch.config.composer import rewrite_recipe_overrides

    rewrite_recipe_overrides(["+recipe=cpu_smoke", "optim=sgd"])  # registers the recipe, as clorch-train does
    recipe = recipe_of(["+recipe=cpu_smoke", "optim.lr=0.01", "optim=sgd", "~log_every", "model.depth=3"])
    assert recipe["defaults"][-1] == {"override /optim": "sgd"}
    assert {"override /model": "mlp"} in recipe["defaults"]  # the sweep's recipe's own choices
    assert recipe["optim"] == {"lr": 0.01} and recipe["model"] == {"hidden_features": 16, "depth": 3}
    assert "log_every" not in recipe and recipe["batch_size"] == 16


# -- tiny sweeps ------------------------------------------------------------------------------


def test_a_sweep_writes_its_best_trial_as_a_recipe_that_reruns_it(tmp_path):
    sweep_dir = tmp_path / "sweep"
    args = [
        "-m",
        *TINY,
        "hydra/sweeper=optuna",
        "optim.lr=tag(log, interval(1e-4, 1e-1))",
        "optim=choice(adamw, sgd)",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.sampler.seed=0",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    done = run_clorch_train(args, tmp_path, env=_env(), timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    best = re.search(r"best trial (\d)", done.stdout).group(1)
    path = sweep_dir / "best.yaml"
    assert f"the best trial's config as a recipe: {path}; rerun it with: clorch-train +recipe={path}" in done.stdout
    assert path.read_text().startswith("# @package _global_\n")
    assert "hydra" not in yaml.safe_load(path.read_text())

    again = run_clorch_train([f"+recipe={path}", f"hydra.run.dir={tmp_path / 'rerun'}"], tmp_path, _env(), 60)
    assert again.returncode == 0, again.stdout + again.stderr
    trial, rerun = sweep_dir / best, tmp_path / "rerun"
    assert (trial / "config.yaml").read_text() == (rerun / "config.yaml").read_text()
    assert _summary(trial)["weights_sha256"] == _summary(rerun)["weights_sha256"]


# -- a time budget ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "-5", "true", "soon"])
def test_a_time_budget_is_a_positive_number_of_seconds(value):
    assert _errors(f"hydra.sweeper.timeout={value}") == [
        "hydra.sweeper.timeout must be a number of seconds > 0 (no new trial starts after it) or null, "
        f"got {yaml.safe_load(value)!r}"
    ]
    assert _errors("hydra.sweeper.timeout=90") == _errors("hydra.sweeper.timeout=0.5") == []


def test_no_trial_starts_once_the_time_budget_is_spent_and_the_running_ones_finish(tmp_path, monkeypatch, capsys):
    from clorch.engine.results import RunSummary
    from clorch.status import Status
    from clorch.sweep import study
    from clorch.sweep.settings import OptunaSettings, SamplerSettings
    from clorch.sweep.space import parse_space

    now = [100.0]
    monkeypatch.setattr(study.time, "monotonic", lambda: now[0])
    space, _ = parse_space(["seed=choice(1,2,3)"])
    settings = OptunaSettings(n_trials=5, n_jobs=2, timeout=60, sampler=SamplerSettings(name="random", seed=0))
    source = study.StudySource(settings, space, tmp_path, uid="u")
    first, second = source.next(), source.next()
    now[0] += 61
    assert source.next() is None and source.next() is None  # spent: none starts, the running finish
    source.ended(first, RunSummary(status=Status.SUCCEEDED, final={"eval_loss": 0.5}))
    source.ended(second, RunSummary(status=Status.SUCCEEDED, final={"eval_loss": 0.4}))
    source.close()
    assert [t.state.name for t in source.study.trials] == ["COMPLETE", "COMPLETE"]
    out = capsys.readouterr().out
    assert out.count("the time budget (hydra.sweeper.timeout=60 s) ended the sweep: no new trial starts; 2 run") == 1


def test_a_sweep_whose_time_budget_is_spent_ends_after_its_running_trial_and_exits_0(tmp_path):
    sweep_dir = tmp_path / "sweep"
    args = ["-m", *TINY, "hydra/sweeper=optuna", "optim.lr=interval(1e-4, 1e-1)", "hydra.sweeper.n_trials=4"]
    done = run_clorch_train([*args, "hydra.sweeper.timeout=1", f"hydra.sweep.dir={sweep_dir}"], tmp_path, _env(), 60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the time budget (hydra.sweeper.timeout=1 s) ended the sweep: no new trial starts" in done.stdout
    assert sorted(p.name for p in sweep_dir.iterdir() if p.name.isdigit()) == ["0"]
