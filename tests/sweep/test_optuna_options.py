"""What Optuna users reach for, by name: sampler and pruner arguments, a time budget, known-good
trials first, several objectives, and the best trial as a recipe file. Each key is checked before
the first trial (unit tests of clorch.sweep.settings and checks); three tiny 1-rank sweeps run them.
The study's side, in-process: test_optuna_options_study.py."""

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


def test_a_space_files_enqueued_trial_and_sampler_arguments_run_and_the_best_trial_is_a_recipe_that_reruns_it(
    tmp_path,
):
    sweep_dir, space = tmp_path / "sweep", tmp_path / "space.yaml"
    space.write_text(
        "params:\n  optim.lr: tag(log, interval(1e-4, 1e-1))\n  optim: [adamw, sgd]\n"
        "n_trials: 2\nsampler: {name: tpe, seed: 0, n_startup_trials: 1, multivariate: true}\n"
        "enqueue:\n  - {optim.lr: 3e-3, optim: sgd}\n"
    )
    args = [
        "-m",
        *TINY,
        "eval_every=1",
        "hydra/sweeper=optuna",
        f"hydra.sweeper.space={space}",
        "hydra.sweeper.pruner=median",  # a name, then its argument: Hydra composes both
        "hydra.sweeper.pruner.n_warmup_steps=1",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    done = run_clorch_train(args, tmp_path, env=_env(), timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    # (as a run of its own: clorch-train forces a key's value, ++optim.lr=..., as for any run)
    overrides = yaml.safe_load((sweep_dir / "0" / ".hydra" / "overrides.yaml").read_text())
    assert [o.lstrip("+") for o in overrides[-2:]] == [
        "optim.lr=0.003",
        "optim=sgd",
    ]
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


def test_a_sweep_whose_time_budget_is_spent_ends_after_its_running_trial_and_exits_0(tmp_path):
    sweep_dir = tmp_path / "sweep"
    args = ["-m", *TINY, "hydra/sweeper=optuna", "optim.lr=interval(1e-4, 1e-1)", "hydra.sweeper.n_trials=4"]
    done = run_clorch_train([*args, "hydra.sweeper.timeout=1", f"hydra.sweep.dir={sweep_dir}"], tmp_path, _env(), 60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the time budget (hydra.sweeper.timeout=1 s) ended the sweep: no new trial starts" in done.stdout
    assert sorted(p.name for p in sweep_dir.iterdir() if p.name.isdigit()) == ["0"]


# -- known-good trials first ------------------------------------------------------------------

SPACE = ["optim.lr=tag(log, interval(1e-4, 1e-1))", "optim=choice(adamw, sgd)", "batch_size=range(8, 33, 8)"]


def _enqueue_errors(value: str) -> list[str]:
    return read_sweep(["hydra/sweeper=optuna", *SPACE, f"hydra.sweeper.enqueue={value}"])[1]


def test_enqueued_trials_are_read_from_the_command_line_as_hydras_grammar_types_them():
    sweep, errors = read_sweep(["hydra/sweeper=optuna", *SPACE, "hydra.sweeper.enqueue=[{optim.lr: 1e-3, optim: sgd}]"])
    assert errors == [] and sweep.settings.enqueue == [{"optim.lr": 0.001, "optim": "sgd"}]


@pytest.mark.parametrize(
    "value, expected",
    [
        (
            "{optim.lr: 1e-3}",
            "hydra.sweeper.enqueue must be a list of {key: value} mappings of searched keys, e.g. "
            "'hydra.sweeper.enqueue=[{optim.lr: 1e-3}]', got {'optim.lr': 0.001}",
        ),
        ("[1e-3]", "hydra.sweeper.enqueue[0] must be a {key: value} mapping of searched keys, got 0.001"),
        (
            "[{seed: 3}]",
            "hydra.sweeper.enqueue[0].seed is not a searched key; an enqueued trial sets searched keys: "
            "optim.lr, optim, batch_size",
        ),
        ("[{optim: adam}]", "hydra.sweeper.enqueue[0].optim='adam' is not one of its choices: adamw, sgd"),
        ("[{optim.lr: 0.5}]", "hydra.sweeper.enqueue[0].optim.lr=0.5 is outside its interval [0.0001, 0.1]"),
        ("[{optim.lr: fast}]", "hydra.sweeper.enqueue[0].optim.lr must be a number in [0.0001, 0.1], got 'fast'"),
        ("[{batch_size: 12}]", "hydra.sweeper.enqueue[0].batch_size=12 is not on its range's step: 8, 16, ... [8, 32]"),
        ("[{},{},{}]", "hydra.sweeper.enqueue[0] must be a {key: value} mapping of searched keys, got {}"),
    ],
)
def test_an_enqueued_trial_is_checked_against_the_space_naming_its_key_and_value(value, expected):
    assert expected in _enqueue_errors(value), _enqueue_errors(value)


def test_more_enqueued_trials_than_the_sweep_runs_is_an_error():
    assert _enqueue_errors("[{optim: sgd},{optim: adamw}]") == []
    more = read_sweep(
        [
            "hydra/sweeper=optuna",
            *SPACE,
            "hydra.sweeper.n_trials=1",
            "hydra.sweeper.enqueue=[{optim: sgd},{optim: sgd}]",
        ]
    )[1]
    assert more == ["hydra.sweeper.enqueue holds 2 trials, more than hydra.sweeper.n_trials=1"]


def test_a_space_files_enqueued_trials_are_read_as_the_command_line_reads_them_and_named_with_the_file(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(
        "params:\n  optim.lr: tag(log, interval(1e-4, 1e-1))\nenqueue:\n  - {optim.lr: 1e-3}\n  - {lr: 1}\n"
    )
    sweep, errors = read_sweep(["hydra/sweeper=optuna", f"hydra.sweeper.space={path}"])
    assert errors == [f"{path}: enqueue[1].lr is not a searched key; an enqueued trial sets searched keys: optim.lr"]
    path.write_text("params:\n  optim.lr: tag(log, interval(1e-4, 1e-1))\nenqueue:\n  - {optim.lr: 1e-3}\n")
    sweep, errors = read_sweep(["hydra/sweeper=optuna", f"hydra.sweeper.space={path}"])
    assert errors == [] and sweep.settings.enqueue == [{"optim.lr": 0.001}]  # YAML's text 1e-3, read as Hydra does


def test_each_enqueued_trials_config_is_checked_before_the_first_trial():
    from clorch.sweep.checks import sweep_errors

    checked: list[list[str]] = []
    overrides = [
        "hydra/sweeper=optuna",
        "max_steps=2",
        *SPACE,
        "hydra.sweeper.enqueue=[{optim.lr: 3e-3, batch_size: 24}]",
    ]
    sweep_errors(overrides, lambda trial: checked.append(trial) or [], lambda trial: None)
    assert ["max_steps=2", "optim.lr=0.003", "optim=adamw", "batch_size=24"] in checked


# -- sampler and pruner arguments -------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        ["hydra.sweeper.pruner=median", "hydra.sweeper.pruner.n_warmup_steps=10"],
        ["hydra.sweeper.pruner.n_warmup_steps=10", "hydra.sweeper.pruner=median"],
        ["hydra.sweeper.pruner={name: median, n_warmup_steps: 10}"],
    ],
)
def test_a_pruner_is_a_name_or_a_mapping_of_its_name_and_arguments_and_min_trials_still_counts(overrides):
    from clorch.sweep.algorithms import PrunerSettings

    sweep, errors = read_sweep(["hydra/sweeper=optuna", "seed=1,2", "hydra.sweeper.min_trials=2", *overrides])
    assert errors == []
    assert sweep.settings.pruning() == PrunerSettings("median", n_startup_trials=2, n_warmup_steps=10)
    assert sweep.settings.pruning().arguments() == {"n_startup_trials": 2, "n_warmup_steps": 10}


def test_a_space_files_sampler_and_pruner_arguments_meet_the_command_lines(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(
        "params:\n  seed: [1, 2]\nsampler: {name: tpe, n_startup_trials: 3, multivariate: true}\npruner: hyperband\n"
    )
    sweep, errors = read_sweep(
        ["hydra/sweeper=optuna", f"hydra.sweeper.space={path}", "hydra.sweeper.pruner.reduction_factor=4"]
    )
    assert errors == []
    assert sweep.settings.sampler.arguments() == {"n_startup_trials": 3, "multivariate": True}
    assert sweep.settings.pruning().name == "hyperband" and sweep.settings.pruning().arguments() == {
        "reduction_factor": 4
    }


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["hydra/sweeper/sampler=random", "hydra.sweeper.sampler.multivariate=true"],
            "hydra.sweeper.sampler.multivariate=true belongs to the tpe sampler; hydra.sweeper.sampler=random takes "
            "no arguments",
        ),
        (
            ["hydra.sweeper.sampler.name=cmaes", "hydra.sweeper.sampler.constant_liar=false"],
            "hydra.sweeper.sampler.constant_liar=false belongs to the tpe sampler; hydra.sweeper.sampler=cmaes takes "
            "n_startup_trials",
        ),
        (
            ["hydra.sweeper.pruner=hyperband", "hydra.sweeper.pruner.n_warmup_steps=3"],
            "hydra.sweeper.pruner.n_warmup_steps=3 belongs to the median pruner; hydra.sweeper.pruner=hyperband "
            "takes min_resource, reduction_factor",
        ),
        (
            ["hydra.sweeper.pruner.min_resource=3"],
            "hydra.sweeper.pruner.min_resource=3 belongs to the hyperband and asha pruners; hydra.sweeper.pruner=none "
            "takes "
            "no arguments",
        ),
        (
            ["hydra.sweeper.sampler.n_startup_trials=-1"],
            "hydra.sweeper.sampler.n_startup_trials must be an integer >= 0",
        ),
        (
            ["hydra.sweeper.sampler.multivariate=yes"],
            "hydra.sweeper.sampler.multivariate must be true or false, got 'yes'",
        ),
        (
            ["hydra.sweeper.pruner=median", "hydra.sweeper.pruner.interval_steps=0"],
            "hydra.sweeper.pruner.interval_steps must be an integer >= 1, got 0",
        ),
        (
            ["hydra.sweeper.pruner=hyperband", "hydra.sweeper.pruner.reduction_factor=1"],
            "hydra.sweeper.pruner.reduction_factor must be an integer >= 2, got 1",
        ),
        (
            ["hydra.sweeper.sampler.group=true"],
            "hydra.sweeper.sampler.group=true needs hydra.sweeper.sampler.multivariate=true",
        ),
        (
            ["hydra.sweeper.pruner=median", "hydra.sweeper.pruner.patience=3"],
            "hydra.sweeper.pruner.patience is not a key of the pruner; it takes: interval_steps, min_resource, "
            "n_startup_trials, n_warmup_steps, name, reduction_factor",
        ),
        (
            ["hydra.sweeper.pruner={name: percentile}"],
            "hydra.sweeper.pruner.name=percentile is not allowed; choose one of: none",
        ),
        (["hydra.sweeper.pruner=[median]"], "hydra.sweeper.pruner must be a name (none, median, hyperband, asha) or a"),
        (
            ["hydra.sweeper.pruner._target_=os.system"],
            "hydra.sweeper.pruner._target_ is not allowed: pruners are chosen by name, hydra.sweeper.pruner.name=NAME",
        ),
        (
            ["hydra.sweeper.sampler.seed=0", "hydra.sweeper.sampler.constant_liar=true"],
            "hydra.sweeper.sampler.constant_liar=true counts running trials as bad ones, but a repeatable sweep",
        ),
    ],
)
def test_a_sampler_or_pruner_argument_is_checked_naming_its_key_value_and_who_takes_it(overrides, expected):
    errors = _errors(*overrides)
    assert any(e.startswith(expected) for e in errors), errors


def test_hydra_composes_a_pruners_name_and_arguments_as_one_mapping():
    from clorch.sweep.checks import as_hydra_overrides

    overrides = ["hydra.sweeper.pruner=median", "x=1", "hydra.sweeper.pruner.n_warmup_steps=10"]
    assert as_hydra_overrides(overrides) == ["hydra.sweeper.pruner={name: median, n_warmup_steps: 10}", "x=1"]
    assert as_hydra_overrides(["hydra.sweeper.pruner=median"]) == ["hydra.sweeper.pruner=median"]


# -- several objectives -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["hydra.sweeper.objective=[eval_loss,loss]"],
            "hydra.sweeper.direction gives 1 direction(s) for 2 objective(s) (eval_loss, loss): give one each, "
            "e.g. direction=[minimize,minimize]",
        ),
        (
            ["hydra.sweeper.direction=[minimize,maximize]"],
            "hydra.sweeper.direction gives 2 direction(s) for 1 objective(s) (the default): give one each",
        ),
        (
            ["hydra.sweeper.objective=[eval_loss,loss]", "hydra.sweeper.direction=[minimize,up]"],
            "hydra.sweeper.direction=up is not allowed; choose one of: minimize, maximize",
        ),
        (
            [
                "hydra.sweeper.objective=[eval_loss,loss]",
                "hydra.sweeper.direction=[minimize,minimize]",
                "hydra.sweeper.pruner=median",
            ],
            "hydra.sweeper.pruner=median cannot prune a sweep of several objectives (hydra.sweeper.objective="
            "[eval_loss,loss]): Optuna prunes single-objective studies only; set hydra.sweeper.pruner=none",
        ),
        (
            [
                "hydra.sweeper.objective=[eval_loss,loss]",
                "hydra.sweeper.direction=[minimize,minimize]",
                "hydra.sweeper.sampler.name=cmaes",
            ],
            "hydra.sweeper.sampler=cmaes searches one objective",
        ),
        (
            ["hydra.sweeper.objective=[loss,loss]", "hydra.sweeper.direction=[minimize,minimize]"],
            "names a metric twice",
        ),
        (["hydra.sweeper.objective=[eval_loss,3]"], "hydra.sweeper.objective must name a metric of the trials'"),
    ],
)
def test_several_objectives_are_checked_before_the_first_trial(overrides, expected):
    errors = _errors(*overrides)
    assert any(expected in e for e in errors), errors


def test_a_sweep_of_several_objectives_names_its_pareto_front_as_the_study_does(tmp_path):
    import csv

    import optuna

    sweep_dir = tmp_path / "sweep"
    args = [
        "-m",
        *TINY,
        "hydra/sweeper=optuna",
        "optim.lr=tag(log, interval(1e-4, 1e-1))",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.sampler.seed=0",
        "hydra.sweeper.objective=[eval_loss,loss]",
        "hydra.sweeper.direction=[minimize,maximize]",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    done = run_clorch_train(args, tmp_path, env=_env(), timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    study = optuna.load_study(study_name="sweep", storage=f"sqlite:///{sweep_dir / 'optuna.db'}")
    front = {str(t.number) for t in study.best_trials}
    with open(sweep_dir / "sweep_summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["job"] for r in rows if r["pareto"] == "True"} == front and front
    assert "the Pareto front of eval_loss (minimized) and loss (maximized): " in done.stdout
    for number in front:
        assert re.search(rf"trial {number}: eval_loss [\d.]+, loss [\d.]+; rerun it with: clorch-train ", done.stdout)
    assert not (sweep_dir / "best.yaml").exists()  # no trial is best alone


def test_a_sweep_directory_holding_what_a_sweep_writes_at_its_end_can_be_continued(tmp_path):
    from clorch.cli.hydra_keys import directory_error
    from clorch.sweep.directory import SWEEP_END_FILES

    for name in ("optuna.db", "sweep_summary.csv", *SWEEP_END_FILES):
        (tmp_path / name).write_text("")
    assert directory_error("hydra.sweep.dir", str(tmp_path)) is None


def test_a_trials_recipe_keeps_the_sweeps_typed_values_not_what_a_runner_changed_for_the_trial():
    from clorch.sweep.best import trial_overrides

    ran = {"recipe": "cpu_smoke", "optim.lr": "0.01", "launcher.nproc_per_node": "1", "accumulation": "2"}
    ran["checkpoint.resume"] = "latest"  # a cut-off trial, resumed
    grid = ["+recipe=cpu_smoke", "optim.lr=0.1,0.01", "launcher.nproc_per_node=auto", "hydra.sweep.dir=/x"]
    assert trial_overrides(grid, ran) == ["+recipe=cpu_smoke", "launcher.nproc_per_node=auto", "optim.lr=0.01"]
    search = [
        "hydra/sweeper=optuna",
        "+recipe=cpu_smoke",
        "optim.lr=interval(1e-3, 1e-1)",
        "launcher.nproc_per_node=auto",
    ]
    assert trial_overrides(search, ran) == ["+recipe=cpu_smoke", "launcher.nproc_per_node=auto", "optim.lr=0.01"]
