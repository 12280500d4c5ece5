"""The sweep directory (clorch.sweep.directory): one sweep at a time, and the same sweep when
continued; the study's storage checked to be this sweep's (clorch.sweep.storage); which running
trials are cut off (clorch.sweep.heartbeat); a trial's objective that ranks nothing."""

from __future__ import annotations

import sqlite3
import time

import optuna
import pytest
import sqlalchemy.exc

from clorch.engine.results import RunSummary
from clorch.status import Status
from clorch.sweep.directory import SweepIdentity, SweepLock, check_identity
from clorch.sweep.errors import StorageError, SweepRefused
from clorch.sweep.heartbeat import BEAT_ATTR, UID_ATTR, cut_off
from clorch.sweep.settings import OptunaSettings
from clorch.sweep.storage import explain, open_study, study_name
from clorch.sweep.study import read_objective
from clorch.sweep.summary import Objective, SweepRow

pytestmark = pytest.mark.timeout(60)


def test_a_second_sweep_into_a_directory_in_use_is_refused_at_once_naming_it(tmp_path):
    first = SweepLock(tmp_path)
    first.acquire()
    with pytest.raises(SweepRefused, match=f"hydra.sweep.dir={tmp_path} is in use by another sweep"):
        SweepLock(tmp_path).acquire()
    first.release()
    again = SweepLock(tmp_path)
    again.acquire()  # released on any exit: the next sweep may start
    again.release()


def _identity(epochs: str, objective: str | None = None) -> SweepIdentity:
    overrides = {"recipe": "cpu_smoke", "epochs": epochs, "optim.lr": "log interval(1e-05, 0.3)"}
    return SweepIdentity("optuna", overrides, objective, "minimize", {"name": "lr"})


def test_a_sweep_into_a_directory_of_another_is_refused_naming_the_difference_unless_asked(tmp_path):
    assert check_identity(tmp_path, _identity("2"), continue_changed=False) == []
    uid = SweepIdentity.read(tmp_path).uid
    assert check_identity(tmp_path, _identity("2"), continue_changed=False) == []  # the same sweep continues
    with pytest.raises(SweepRefused, match="epochs=2 before, epochs=4 now") as refused:
        check_identity(tmp_path, _identity("4", "eval_accuracy"), continue_changed=False)
    assert "objective None before, eval_accuracy now" in str(refused.value)
    assert "hydra.sweeper.continue_changed=true" in str(refused.value)
    changes = check_identity(tmp_path, _identity("4"), continue_changed=True)
    assert changes == ["epochs=2 before, epochs=4 now"]
    recorded = SweepIdentity.read(tmp_path)
    assert recorded.overrides["epochs"] == "4" and recorded.uid == uid


def _settings(**keys) -> OptunaSettings:
    return OptunaSettings(**keys)


def _finished_trial(sweep_dir, number: int) -> None:
    (sweep_dir / str(number)).mkdir(parents=True)
    (sweep_dir / str(number) / "summary.json").write_text('{"status": "succeeded"}')


@pytest.mark.parametrize("lost", ["deleted", "empty"])
def test_a_lost_study_beside_finished_trials_is_refused_naming_them(tmp_path, lost):
    _finished_trial(tmp_path, 0)
    _finished_trial(tmp_path, 1)
    if lost == "empty":
        (tmp_path / "optuna.db").write_bytes(b"")
    with pytest.raises(SweepRefused, match=r"holds no study .* finished trial\(s\) 0, 1"):
        open_study(_settings(), tmp_path, uid="a")


def test_a_symlinked_study_file_is_refused(tmp_path):
    outside = tmp_path / "elsewhere.db"
    outside.write_bytes(b"")
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "optuna.db").symlink_to(outside)
    with pytest.raises(SweepRefused, match="is a symbolic link"):
        open_study(_settings(), tmp_path / "sweep", uid="a")
    assert outside.stat().st_size == 0, "nothing written through the link"


def test_a_study_copied_in_from_another_sweep_is_refused(tmp_path):
    study, *_ = open_study(_settings(), tmp_path, uid="first")
    assert study.user_attrs[UID_ATTR] == "first"
    open_study(_settings(), tmp_path, uid="first")  # the same sweep, continued
    with pytest.raises(SweepRefused, match="of another sweep"):
        open_study(_settings(), tmp_path, uid="second")


def test_sweeps_sharing_a_storage_never_share_a_default_study_name(tmp_path):
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    a, b = tmp_path / "projA" / "lr", tmp_path / "projB" / "lr"
    assert study_name(_settings(storage=storage), a) != study_name(_settings(storage=storage), b)
    assert study_name(_settings(), a) == "lr"  # its own file: the directory's name, as before
    assert study_name(_settings(storage=storage, study_name="mine"), a) == "mine"


def test_a_damaged_study_file_is_one_line_naming_it(tmp_path):
    (tmp_path / "optuna.db").write_text("garbage " * 100)
    with pytest.raises(StorageError) as failed:
        open_study(_settings(), tmp_path, uid="a")
    message = str(failed.value)
    assert "\n" not in message and str(tmp_path / "optuna.db") in message and "damaged" in message


@pytest.mark.parametrize(
    "driver, hint",
    [
        ("database is locked", "locked past 60 s"),
        ("attempt to write a readonly database", "read-only"),
        ("database or disk is full", "disk is full"),
    ],
)
def test_storage_failures_say_what_to_do(driver, hint):
    error = sqlalchemy.exc.OperationalError("INSERT ...", {}, sqlite3.OperationalError(driver))
    assert explain(error, "/s/optuna.db").startswith("/s/optuna.db ") and hint in explain(error, "/s/optuna.db")
    assert explain(ImportError("no psycopg2"), "hydra.sweeper.storage=postgresql://h/db").startswith(
        "hydra.sweeper.storage=postgresql://h/db: no driver"
    )


def test_a_live_trial_of_another_sweep_is_never_taken_for_cut_off(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}")
    now = time.time()
    marks = {
        "ours": {UID_ATTR: "me", BEAT_ATTR: now},  # this directory's: its sweep has ended
        "live elsewhere": {UID_ATTR: "other", BEAT_ATTR: now - 5},
        "stale elsewhere": {UID_ATTR: "other", BEAT_ATTR: now - 3600},
        "released elsewhere": {UID_ATTR: "other", BEAT_ATTR: 0.0},
        "unmarked": {},
    }
    for attrs in marks.values():
        trial = study.ask()
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
    names = list(marks)
    found = [names[t.number] for t in cut_off(study.trials, "me", own_file=False, now=now)]
    assert found == ["ours", "stale elsewhere", "released elsewhere"]
    found = [names[t.number] for t in cut_off(study.trials, "me", own_file=True, now=now)]
    assert found == ["ours", "stale elsewhere", "released elsewhere", "unmarked"]


def test_a_trial_without_a_finite_objective_is_failed_with_the_reason_and_never_best():
    summary = RunSummary(status=Status.SUCCEEDED, final={"loss": 0.5, "eval_loss": float("nan")})
    assert read_objective(summary, "eval_los") == (
        None,
        "hydra.sweeper.objective=eval_los is not in its final metrics (it has: eval_loss, loss)",
    )
    value, why = read_objective(summary, None)
    assert value is None and "eval_loss is nan" in why
    objective = Objective(required=True)
    rows = [
        SweepRow("0", status=Status.SUCCEEDED, objective=objective.value({"eval_loss": float("nan")})),
        SweepRow("1", status=Status.SUCCEEDED, objective=objective.value({"eval_loss": 0.7})),
    ]
    assert rows[0].objective is None and objective.best(rows).job == "1"
    assert [objective.counted_status(r) for r in rows] == [Status.FAILED, Status.SUCCEEDED]
    assert Objective().counted_status(rows[0]) is Status.SUCCEEDED  # the grid only ranks
