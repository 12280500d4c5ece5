"""The Optuna study's side of what Optuna users reach for, in-process (no trial runs): a time
budget, enqueued trials asked first and once, sampler and pruner arguments reaching Optuna,
several objectives told to the study, the Pareto front (clorch.sweep.study, clorch.train.trial,
clorch.sweep.objectives). The keys' checks and a few tiny sweeps: test_optuna_options.py."""

from __future__ import annotations

import pytest

from clorch.sweep.checks import read_sweep

pytestmark = pytest.mark.timeout(60)
SPACE = ["optim.lr=tag(log, interval(1e-4, 1e-1))", "optim=choice(adamw, sgd)", "batch_size=range(8, 33, 8)"]


def _errors(*overrides: str) -> list[str]:
    return read_sweep(["hydra/sweeper=optuna", "optim.lr=interval(1e-4, 1e-1)", *overrides])[1]


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


def test_enqueued_trials_are_asked_first_in_order_and_once(tmp_path):
    from clorch.engine.results import RunSummary
    from clorch.status import Status
    from clorch.sweep.study import StudySource

    sweep, errors = read_sweep(
        [
            "hydra/sweeper=optuna",
            *SPACE,
            "hydra.sweeper.n_trials=3",
            "hydra.sweeper.sampler.seed=1",
            "hydra.sweeper.enqueue=[{optim.lr: 1e-3, optim: sgd, batch_size: 16}, {optim: adamw}]",
        ]
    )
    assert errors == []
    source = StudySource(sweep.settings, sweep.space, tmp_path, uid="u")
    labels = []
    for _ in range(2):  # one at a time (n_jobs=1): a seeded TPE trial is asked once the one before has ended
        spec = source.next()
        labels.append(spec.label)
        source.ended(spec, RunSummary(status=Status.SUCCEEDED, final={"eval_loss": 1.0}))
    source.close()
    assert labels[0] == "optim.lr=0.001 optim=sgd batch_size=16"
    assert "optim=adamw" in labels[1].split()  # its other keys sampled
    again = StudySource(sweep.settings, sweep.space, tmp_path, uid="u")  # the sweep continued
    third = again.next()
    again.close()
    assert third.number == 2 and [t.number for t in again.study.trials] == [0, 1, 2]
    assert [t.params for t in again.study.trials[:2]] == [source.study.trials[0].params, source.study.trials[1].params]


def test_constant_liar_is_the_users_choice_where_the_sweep_is_not_repeatable(monkeypatch):
    import optuna

    from clorch.sweep.study import make_sampler

    assert (
        _errors(
            "hydra.sweeper.sampler.seed=0", "hydra.sweeper.repeatable=false", "hydra.sweeper.sampler.constant_liar=true"
        )
        == []
    )
    given = []
    monkeypatch.setattr(optuna.samplers, "TPESampler", lambda **kwargs: given.append(kwargs))
    for extra in ([], ["hydra.sweeper.sampler.n_startup_trials=2", "hydra.sweeper.sampler.multivariate=true"]):
        sweep, _ = read_sweep(["hydra/sweeper=optuna", "seed=1,2", "hydra.sweeper.n_jobs=2", *extra])
        make_sampler(sweep.settings, sweep.space, 0)
    assert given == [
        {"seed": None, "constant_liar": True},  # side by side, not repeatable: clorch's default
        {"seed": None, "n_startup_trials": 2, "multivariate": True, "constant_liar": True},
    ]


def test_the_median_pruners_warmup_steps_keep_an_early_bad_trial_running(tmp_path):
    import optuna

    from clorch.train.trial import make_pruner

    def pruned_at_step_5(args):
        study = optuna.create_study(
            storage=f"sqlite:///{tmp_path}/{len(args)}.db", pruner=make_pruner("median", 0, args)
        )
        good = study.ask()
        good.report(0.1, 5)
        study.tell(good, 0.1)
        bad = study.ask()
        bad.report(9.0, 5)
        return bad.should_prune()

    assert pruned_at_step_5({}) and not pruned_at_step_5({"n_warmup_steps": 10})


def test_a_trial_carries_its_pruners_arguments_to_its_ranks(tmp_path):
    from clorch.sweep.study import StudySource
    from clorch.train.trial import TrialLink

    sweep, _ = read_sweep(
        ["hydra/sweeper=optuna", "seed=1,2", "hydra.sweeper.pruner={name: median, interval_steps: 2}"]
    )
    source = StudySource(sweep.settings, sweep.space, tmp_path, uid="u")
    link = TrialLink.from_env(source.next().env)
    source.close()
    assert (link.pruner, link.pruner_args) == ("median", {"n_startup_trials": 5, "interval_steps": 2})


def test_the_pareto_front_holds_the_trials_no_other_beats_on_every_objective():
    from clorch.sweep.objectives import pareto_front

    points = [(1.0, 5.0), (2.0, 4.0), (2.0, 6.0), (3.0, 3.0), (1.0, 5.0)]
    assert pareto_front(points, ["minimize", "minimize"]) == [0, 1, 3, 4]  # (2, 6) is beaten by (1, 5)
    assert pareto_front(points, ["minimize", "maximize"]) == [0, 2, 4]


def test_a_trial_of_several_objectives_is_told_each_and_reports_nothing_at_its_evals(tmp_path):
    from clorch.engine.results import RunSummary
    from clorch.status import Status
    from clorch.sweep.study import StudySource
    from clorch.train.trial import TrialLink

    sweep, errors = read_sweep(
        [
            "hydra/sweeper=optuna",
            "seed=1,2",
            "hydra.sweeper.n_trials=2",
            "hydra.sweeper.objective=[eval_loss,loss]",
            "hydra.sweeper.direction=[minimize,maximize]",
        ]
    )
    assert errors == []
    source = StudySource(sweep.settings, sweep.space, tmp_path, uid="u")
    first, second = source.next(), source.next()
    assert TrialLink.from_env(first.env).objective == ""  # Optuna's trials report one value, to prune
    source.ended(first, RunSummary(status=Status.SUCCEEDED, final={"eval_loss": 0.5, "loss": 0.7}))
    source.ended(second, RunSummary(status=Status.SUCCEEDED, final={"eval_loss": 0.5}))
    source.close()
    assert [t.values for t in source.study.trials] == [[0.5, 0.7], None]
    assert [t.state.name for t in source.study.trials] == ["COMPLETE", "FAIL"]
