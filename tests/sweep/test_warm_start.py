"""A warm start (`hydra.sweeper.warm_start`, clorch.sweep.warm_start): another sweep's finished trials
added to the study before the first trial, once, without shifting the sweep's own trial directories;
and every refusal before the first trial. Tiny 1-rank CPU trials for the sweep run end to end."""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path

import optuna
import pytest
import yaml

from clorch.engine.results import RunSummary
from clorch.status import Status
from clorch.sweep.checks import read_sweep
from clorch.sweep.directory import SweepIdentity
from clorch.sweep.errors import SweepRefused
from clorch.sweep.settings import OptunaSettings, SamplerSettings
from clorch.sweep.space import parse_space
from clorch.sweep.study import StudySource
from clorch.sweep.warm_start import ATTR, numbering, origin
from clorch.train.trial import TrialLink
from tests.clirunner import run_clorch_train, run_clorch_train_batch

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
LR = "optim.lr=tag(log, interval(1e-4, 1e-1))"
SPACE = [LR, "data.batch_size=choice(4,8)"]
TINY = ["+recipe=cpu_smoke", "launcher.nproc_per_node=1", "max_steps=2"]
SWEEP = ["-m", *TINY, "hydra/sweeper=optuna", LR, "hydra.sweeper.sampler.seed=3"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _study(sweep_dir: Path, name: str | None = None) -> optuna.Study:
    storage = f"sqlite:///{sweep_dir / 'optuna.db'}"
    return optuna.load_study(study_name=name or sweep_dir.name, storage=storage)


def _earlier_sweep(sweep_dir: Path, lines: list[str], values: list[float], **identity) -> optuna.Study:
    """A finished sweep of the Optuna sweeper as clorch leaves it (sweep.json, optuna.db), its study's
    trials COMPLETE with `values`, and one FAIL trial, which a warm start leaves out."""
    space, errors = parse_space(lines)
    assert not errors
    sweep_dir.mkdir(parents=True)
    study_keys = {"name": sweep_dir.name, "storage": None}
    overrides = {line.partition("=")[0]: line.partition("=")[2] for line in lines}
    identity = {"direction": "minimize", **identity}  # as a sweep records its default
    SweepIdentity("optuna", overrides, study=study_keys, uid=f"uid-{sweep_dir.name}", **identity).write(sweep_dir)
    study = optuna.create_study(
        study_name=sweep_dir.name,
        storage=f"sqlite:///{sweep_dir / 'optuna.db'}",
        sampler=optuna.samplers.RandomSampler(0),
    )
    distributions = {p.key: p.distribution() for p in space.params}
    for value in values:
        study.tell(study.ask(distributions), value)
    study.tell(study.ask(distributions), state=optuna.trial.TrialState.FAIL)
    return study


def _source(sweep_dir: Path, warm: Path | None, lines=SPACE, n_trials=2, n_jobs=1, uid="me") -> StudySource:
    space, errors = parse_space(lines)
    assert not errors
    settings = OptunaSettings(
        n_trials=n_trials,
        n_jobs=n_jobs,
        sampler=SamplerSettings(name="tpe", seed=0),
        warm_start=None if warm is None else str(warm),
    )
    sweep_dir.mkdir(exist_ok=True)
    return StudySource(settings, space, sweep_dir, uid=uid)


def _succeeded(value: float) -> RunSummary:
    return RunSummary(status=Status.SUCCEEDED, final={"loss": 1.0, "eval_loss": value})


def _run_all(source: StudySource, values: list[float]) -> list[int]:
    numbers = []
    for value in values:
        spec = source.next()
        numbers.append(spec.number)
        source.ended(spec, _succeeded(value))
    assert source.next() is None  # n_trials counts this sweep's own trials only
    source.close()
    return numbers


def test_the_finished_trials_come_first_in_the_study_and_the_sweeps_own_are_numbered_from_0(tmp_path, capsys):
    earlier = _earlier_sweep(tmp_path / "earlier", SPACE, [0.9, 0.7, 0.8])
    source = _source(tmp_path / "now", tmp_path / "earlier", n_trials=2)
    assert _run_all(source, [0.3, 0.4]) == [0, 1]  # the directories SWEEP_DIR/0 and /1
    trials = _study(tmp_path / "now").trials
    assert [origin(t) for t in trials] == [("uid-earlier", 0), ("uid-earlier", 1), ("uid-earlier", 2), None, None]
    for added, before in zip(trials[:3], earlier.trials[:3]):
        assert (added.params, added.distributions, added.values) == (before.params, before.distributions, before.values)
        assert added.state == optuna.trial.TrialState.COMPLETE
    # Each of this sweep's results is told to its own trial, the study's 3 and 4, not to an added one.
    assert [t.values for t in trials[3:]] == [[0.3], [0.4]]
    assert trials[0].values == [0.9]
    said = capsys.readouterr().out
    assert f"warm start from {tmp_path / 'earlier'}: 3 finished trial(s) added to the study" in said


def test_continuing_the_sweep_adds_nothing_twice(tmp_path, capsys):
    _earlier_sweep(tmp_path / "earlier", SPACE, [0.9, 0.7])
    _source(tmp_path / "now", tmp_path / "earlier", n_trials=1).close()  # added; stopped before a trial
    capsys.readouterr()
    assert _run_all(_source(tmp_path / "now", tmp_path / "earlier", n_trials=1), [0.5]) == [0]
    assert "0 finished trial(s) added to the study, 2 added before and kept" in capsys.readouterr().out
    # Continued with more trials, and the earlier sweep has finished one more since: left out.
    study = _study(tmp_path / "earlier")
    study.tell(study.ask({k: v for k, v in study.trials[0].distributions.items()}), 0.1)
    assert _run_all(_source(tmp_path / "now", tmp_path / "earlier", n_trials=2), [0.6]) == [1]
    assert "1 finished there since this sweep began are left out" in capsys.readouterr().out
    # Continued without the key: the study still numbers the sweep's trials after the added ones.
    assert _run_all(_source(tmp_path / "now", None, n_trials=3), [0.7]) == [2]
    trials = _study(tmp_path / "now").trials
    assert [origin(t) is not None for t in trials] == [True, True, False, False, False]
    assert [t.values for t in trials[2:]] == [[0.5], [0.6], [0.7]]


def test_a_repeatable_sweeps_trials_are_asked_on_every_added_trial_and_their_own_up_to_k_minus_n_jobs(tmp_path):
    _earlier_sweep(tmp_path / "earlier", SPACE, [0.9, 0.7, 0.8])
    source = _source(tmp_path / "now", tmp_path / "earlier", n_trials=3, n_jobs=2)
    first, second = source.next(), source.next()
    seen = [TrialLink.from_env(s.env).compared_up_to for s in (first, second)]
    assert (first.number, second.number, seen) == (0, 1, [2, 2])  # the study's 0..2: the added ones
    source.ended(first, _succeeded(0.5))
    third = source.next()
    assert third.number == 2 and TrialLink.from_env(third.env).compared_up_to == 3  # and its own trial 0
    source.ended(second, _succeeded(0.6))
    source.ended(third, _succeeded(0.7))
    source.close()


def test_a_searched_space_that_differs_is_refused_naming_each_key(tmp_path):
    _earlier_sweep(tmp_path / "earlier", ["optim.lr=tag(log, interval(1e-5, 1e-1))", "seed=choice(1,2)"], [0.5])
    with pytest.raises(SweepRefused) as refused:
        _source(tmp_path / "now", tmp_path / "earlier", lines=[LR, "data.batch_size=choice(4,8)"])
    message = str(refused.value)
    assert f"hydra.sweeper.warm_start={tmp_path / 'earlier'} searched another space" in message
    assert "optim.lr log interval(1e-05, 0.1) there, log interval(0.0001, 0.1) here" in message
    assert "data.batch_size not searched there, choice(4, 8) here" in message
    assert "seed searched there (choice(1, 2)), not here" in message
    assert len(_study(tmp_path / "now").trials) == 0  # nothing added
    _earlier_sweep(tmp_path / "choices", [LR, "data.batch_size=choice(4,16)"], [0.5])
    with pytest.raises(SweepRefused, match=r"data.batch_size choice\(4, 16\) there, choice\(4, 8\) here"):
        _source(tmp_path / "other", tmp_path / "choices")


def test_a_sweep_that_ran_trials_of_its_own_or_its_own_directory_is_refused(tmp_path):
    _earlier_sweep(tmp_path / "earlier", SPACE, [0.5])
    _run_all(_source(tmp_path / "now", None, n_trials=1), [0.4])
    with pytest.raises(SweepRefused, match=r"holds 1 trial\(s\) of its own already, and a warm start is added before"):
        _source(tmp_path / "now", tmp_path / "earlier", n_trials=2)
    (tmp_path / "now" / "sweep.json").write_text(
        json.dumps({"sweeper": "optuna", "overrides": {}, "study": {"name": "now"}})
    )
    with pytest.raises(SweepRefused, match=r"is this sweep's own directory \(hydra.sweep.dir="):
        _source(tmp_path / "now", tmp_path / "now", n_trials=2)
    # A copy of this sweep's directory elsewhere carries its id: its trials are this study's already.
    _earlier_sweep(tmp_path / "copy", SPACE, [0.5])
    with pytest.raises(SweepRefused, match="is this sweep's own directory"):
        _source(tmp_path / "again", tmp_path / "copy", uid="uid-copy")


def test_added_trials_after_the_sweeps_own_cannot_be_numbered_and_are_refused():
    own, added = optuna.trial.create_trial(value=1.0), optuna.trial.create_trial(value=1.0, user_attrs={ATTR: {}})
    own.number, added.number = 0, 1
    with pytest.raises(SweepRefused, match="holds warm-start trials"):
        numbering([own, added], "optuna.db")
    added.number, own.number = 0, 1
    assert numbering([added, own], "optuna.db").own(1) == 0


def _errors(*keys: str) -> list[str]:
    sweep, errors = read_sweep(["hydra/sweeper=optuna", LR, *keys])
    return errors


def test_the_command_lines_check_refuses_what_is_no_earlier_optuna_sweep_of_the_same_objective(tmp_path):
    (tmp_path / "plain").mkdir()
    grid = tmp_path / "grid"
    grid.mkdir()
    SweepIdentity("basic", {"seed": "1,2"}).write(grid)
    _earlier_sweep(tmp_path / "earlier", [LR], [0.5], objective="eval_loss", direction="minimize")
    assert _errors(f"hydra.sweeper.warm_start={tmp_path / 'missing'}") == [
        f"hydra.sweeper.warm_start={tmp_path / 'missing'} is not a directory; a warm start takes the "
        "hydra.sweep.dir of an earlier hydra/sweeper=optuna sweep"
    ]
    assert "(it holds no sweep.json that clorch wrote)" in _errors(f"hydra.sweeper.warm_start={tmp_path / 'plain'}")[0]
    assert (
        "(it holds a sweep of hydra/sweeper=basic, which has no study)"
        in (_errors(f"hydra.sweeper.warm_start={grid}")[0])
    )
    other = _errors(
        f"hydra.sweeper.warm_start={tmp_path / 'earlier'}",
        "hydra.sweeper.objective=loss",
        "hydra.sweeper.direction=maximize",
    )
    key = f"hydra.sweeper.warm_start={tmp_path / 'earlier'}"
    assert [e.split(":")[0] for e in other] == [
        f"{key} searched for objective ['eval_loss'], this sweep for ['loss']",
        f"{key} searched for direction ['minimize'], this sweep for ['maximize']",
    ]
    own = _errors(key, "hydra.sweeper.objective=eval_loss", f"hydra.sweep.dir={tmp_path / 'earlier'}")
    assert own == [
        f"{key} is this sweep's own directory (hydra.sweep.dir={tmp_path / 'earlier'}): its trials are this "
        "study's already; give another sweep's directory, or drop warm_start"
    ]
    assert _errors("hydra.sweeper.warm_start=5") == [
        "hydra.sweeper.warm_start must be another sweep's directory (its hydra.sweep.dir) or null, got 5"
    ]
    assert _errors(f"hydra.sweeper.warm_start={tmp_path / 'earlier'}", "hydra.sweeper.objective=eval_loss") == []


def test_a_search_space_file_may_name_the_warm_start(tmp_path):
    _earlier_sweep(tmp_path / "earlier", [LR], [0.5])
    space = tmp_path / "space.yaml"
    space.write_text(
        yaml.safe_dump({"params": {"optim.lr": "tag(log, interval(1e-4, 1e-1))"}, "warm_start": "nowhere"})
    )
    sweep, errors = read_sweep(["hydra/sweeper=optuna", f"hydra.sweeper.space={space}"])
    assert errors == [
        "hydra.sweeper.warm_start=nowhere is not a directory; a warm start takes the hydra.sweep.dir of an earlier "
        "hydra/sweeper=optuna sweep"
    ]
    given = f"hydra.sweeper.warm_start={tmp_path / 'earlier'}"  # the command line wins
    sweep, errors = read_sweep(["hydra/sweeper=optuna", f"hydra.sweeper.space={space}", given])
    assert errors == [] and sweep.settings.warm_start == str(tmp_path / "earlier")


def _rows(sweep_dir: Path) -> list[dict[str, str]]:
    with open(sweep_dir / "sweep_summary.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.timeout(240)
def test_a_warm_started_sweep_adds_an_earlier_sweeps_trials_and_runs_its_own_in_0_to_n_minus_1(tmp_path):
    earlier, now = tmp_path / "earlier", tmp_path / "now"
    done = run_clorch_train([*SWEEP, "hydra.sweeper.n_trials=1", f"hydra.sweep.dir={earlier}"], tmp_path, env=_env())
    assert done.returncode == 0, done.stdout + done.stderr
    warm = [*SWEEP, f"hydra.sweeper.warm_start={earlier}", f"hydra.sweep.dir={now}", "hydra.sweeper.n_trials=2"]
    done = run_clorch_train(warm, tmp_path, env=_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"warm start from {earlier}: 1 finished trial(s) added to the study" in done.stdout
    assert sorted(p.name for p in now.iterdir() if p.name.isdigit()) == ["0", "1"]
    assert [r["job"] for r in _rows(now)] == ["0", "1"]  # the summary holds this sweep's trials only
    assert re.search(r"best trial [01]: eval_loss", done.stdout)
    trials, before = _study(now).trials, _study(earlier).trials
    assert len(trials) == 3 and (trials[0].params, trials[0].values) == (before[0].params, before[0].values)
    assert origin(trials[0]) == (json.loads((earlier / "sweep.json").read_text())["uid"], 0)
    # Seeded by its number in the study, trial 0 here is not the earlier sweep's trial 0 asked again.
    assert trials[1].params != before[0].params
    for number, trial in enumerate(trials[1:]):  # SWEEP_DIR/N trained the study's trial N + 1
        assert origin(trial) is None and trial.state == optuna.trial.TrialState.COMPLETE
        overrides = yaml.safe_load((now / str(number) / ".hydra" / "overrides.yaml").read_text())
        assert f"++optim.lr={trial.params['optim.lr']}" in overrides


def test_a_refused_warm_start_runs_no_trial(tmp_path):
    _earlier_sweep(tmp_path / "earlier", ["optim.lr=tag(log, interval(1e-3, 1e-1))"], [0.5])
    warm = [*SWEEP, "hydra.sweeper.n_trials=1", f"hydra.sweeper.warm_start={tmp_path / 'earlier'}"]
    other_space, other_objective = tmp_path / "space", tmp_path / "objective"
    batch = [
        ([*warm, f"hydra.sweep.dir={other_space}"], tmp_path),  # refused as the study is opened
        ([*warm, "hydra.sweeper.objective=loss", f"hydra.sweep.dir={other_objective}"], tmp_path),  # by the check
    ]
    space, objective = run_clorch_train_batch(batch, env=_env(), timeout=100)
    assert space.returncode != 0 and objective.returncode != 0
    assert "searched another space: optim.lr log interval(0.001, 0.1) there, log interval(0.0001, 0.1) here" in (
        space.stdout + space.stderr
    )
    assert "searched for objective [None], this sweep for ['loss']" in objective.stdout + objective.stderr
    assert not any(p.name.isdigit() for p in other_space.iterdir())
    assert not other_objective.exists()
