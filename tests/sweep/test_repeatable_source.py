"""A repeatable sweep's source and pruner, without training: the order in which trials end decides
what first-come scheduling asks and prunes, and nothing of what a repeatable sweep does
(clorch.sweep.study, clorch.train.trial.trials_up_to)."""

from __future__ import annotations

import importlib.util
import math

import optuna
import pytest

from clorch.engine.results import RunSummary
from clorch.status import Status
from clorch.sweep.settings import OptunaSettings, SamplerSettings, optuna_errors
from clorch.sweep.space import parse_space
from clorch.sweep.study import StudySource
from clorch.train.trial import TrialLink, TrialReporter, make_pruner, trials_up_to

pytestmark = pytest.mark.timeout(120)
SPACE = ["optim.lr=tag(log, interval(1e-5, 1e-1))", "optim.weight_decay=interval(0.0, 0.2)"]


def _settings(sampler: str = "tpe", repeatable: bool | None = None, **more) -> OptunaSettings:
    return OptunaSettings(sampler=SamplerSettings(name=sampler, seed=0), repeatable=repeatable, **more)


def _sweep(sweep_dir, settings: OptunaSettings, last_first: bool) -> list[dict]:
    """Run a sweep of fake trials, 2 at a time, each ending with an objective of its parameters: the
    lowest-numbered running trial ends first, or (`last_first`) the highest. The parameters asked."""
    space, errors = parse_space(SPACE)
    assert not errors
    sweep_dir.mkdir()
    source = StudySource(settings, space, sweep_dir, uid="u")
    running = []
    while True:
        while len(running) < settings.n_jobs and (spec := source.next()) is not None:
            running.append(spec)
        if not running:
            break
        spec = max(running, key=lambda s: s.number) if last_first else min(running, key=lambda s: s.number)
        running.remove(spec)
        params = source.study.trials[spec.number].params
        value = (math.log10(params["optim.lr"]) + 3) ** 2 + params["optim.weight_decay"]
        source.ended(spec, RunSummary(status=Status.SUCCEEDED, final={"eval_loss": value}))
    source.close()
    return [t.params for t in source.study.trials]


NO_CMAES = pytest.mark.skipif(importlib.util.find_spec("cmaes") is None, reason="Optuna's CMA-ES needs cmaes")


@pytest.mark.parametrize("sampler", ["tpe", pytest.param("cmaes", marks=NO_CMAES)])
def test_first_come_asks_what_ended_first_a_repeatable_sweep_asks_by_number(tmp_path, sampler):
    first_come = _settings(sampler, repeatable=False, n_trials=14, n_jobs=2)
    in_order, reversed_ = (_sweep(tmp_path / f"fc{i}", first_come, last_first=i) for i in (False, True))
    assert len(in_order) == len(reversed_) == 14
    assert in_order != reversed_, "first come: the trials that ended first decide the next asks"

    repeatable = _settings(sampler, n_trials=14, n_jobs=2)  # repeatable: the seed's default
    assert repeatable.repeats()
    in_order, reversed_ = (_sweep(tmp_path / f"r{i}", repeatable, last_first=i) for i in (False, True))
    assert in_order == reversed_ and len(in_order) == 14


def _study_at_step_2(storage: str, trial_2_ended: bool) -> optuna.Study:
    """Trials 0 and 1 completed; trial 2 (completed or still running) and trial 3 reported at step 2."""
    study = optuna.create_study(study_name="s", storage=storage, pruner=make_pruner("median", 0))
    for value in (0.5, 0.7):
        trial = study.ask()
        trial.report(value, 2)
        study.tell(trial, value)
    beside = study.ask()
    beside.report(0.8, 2)
    if trial_2_ended:
        study.tell(beside, 0.8)
    study.ask()  # trial 3, the one the pruner decides on
    return study


@pytest.mark.parametrize("compared_up_to", [None, 1])
def test_a_trial_ending_beside_it_changes_a_first_come_prune_not_a_repeatable_one(tmp_path, compared_up_to):
    decisions = []
    for ended in (False, True):
        storage = f"sqlite:///{tmp_path / f'{compared_up_to}_{ended}.db'}"
        study = _study_at_step_2(storage, ended)
        link = TrialLink(storage, "s", study.trials[3]._trial_id, "eval_loss", "median", 0, compared_up_to)
        reporter = TrialReporter(link, rank=0, broadcast_flag=lambda flag: flag)
        decisions.append(reporter.should_stop(2, {"loss": 0.65}))
    # The median of the completed trials at step 2: 0.6 without trial 2, 0.7 with it.
    assert decisions == ([True, False] if compared_up_to is None else [True, True])


def test_samplers_and_pruners_see_through_the_view_what_a_study_of_those_trials_holds(tmp_path):
    """Optuna's TPE and median pruner read a study's trials through its storage's get_all_trials only:
    on trials_up_to(storage, 4) they decide as on a study that holds trials 0 to 4 alone."""
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'view.db'}")
    study = optuna.create_study(study_name="s", storage=storage, sampler=optuna.samplers.RandomSampler(seed=1))
    for number in range(16):  # 0-11 complete (with a value at step 1), 12-15 running (one reported a bad value)
        trial = study.ask({"x": optuna.distributions.FloatDistribution(-3, 3)})
        trial.report((trial.params["x"] - 1) ** 2, 1)
        if number < 12:
            study.tell(trial, (trial.params["x"] - 1) ** 2)
    alone = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=3))
    alone.add_trials(study.trials[:5])
    view = optuna.load_study(
        study_name="s",
        storage=trials_up_to(storage, 4),
        sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=3, constant_liar=True),
    )
    space = {"x": optuna.distributions.FloatDistribution(-3, 3)}
    asked = view.ask(space)
    assert asked.params == alone.ask(space).params
    assert asked.number == 16 and len(study.trials) == 17, "the asked trial is the study's own"
    assert [t.number for t in view.trials] == [0, 1, 2, 3, 4]
    whole = optuna.load_study(
        study_name="s", storage=storage, sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=3)
    )
    assert whole.ask(space).params != asked.params, "the whole study would have asked otherwise"

    pruner, decided = make_pruner("median", 0), set()
    for value in (0.001, 1.0, 4.0, 100.0):
        frozen = optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING, intermediate_values={1: value})
        assert pruner.prune(view, frozen) == pruner.prune(alone, frozen)
        decided.add(pruner.prune(view, frozen))
    assert decided == {True, False}


def test_repeatable_follows_the_seed_and_a_repeatable_sweep_needs_one():
    assert _settings().repeats() and not _settings(repeatable=False).repeats()
    assert not OptunaSettings().repeats()  # unseeded: first come
    unseeded = OptunaSettings(repeatable=True)
    assert optuna_errors(unseeded) == [
        "hydra.sweeper.repeatable=true needs hydra.sweeper.sampler.seed: an unseeded sampler asks other trials "
        "each run; set sampler.seed=INT"
    ]
    assert optuna_errors(_settings(repeatable="yes")) == [
        "hydra.sweeper.repeatable must be true, false or null (true when sampler.seed is given), got 'yes'"
    ]


def test_the_cmaes_sampler_without_its_package_is_a_config_error():
    import importlib.util

    from clorch.sweep.settings import OptunaSettings, SamplerSettings, optuna_errors

    errors = optuna_errors(OptunaSettings(sampler=SamplerSettings(name="cmaes")))
    missing = importlib.util.find_spec("cmaes") is None
    assert any("needs the cmaes package" in e for e in errors) == missing, errors
