"""Experiment trackers: what MLflow and W&B hold after a run, read back with their own readers;
a tracker that fails warns once and goes quiet; the extras' install lines; the store's place."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

import pytest

from clorch import trackers
from clorch.trackers import (
    build_trackers,
    default_tracking_uri,
    flatten,
    missing_extras,
    mlflow_tracker,
    resolve_wandb_mode,
    run_name,
)
from tests.trackers_support import wandb_records_once_written

CONFIG = {
    "optim": {"name": "adamw", "lr": 0.003, "betas": [0.9, 0.95]},
    "batch_size": 32,
    "model": {"_target_": "clorch.models.MLP", "width": 16, "dropout": None},
    "seed": 7,
    "notes": "x" * 7000,
}
RECORDS = [
    {"kind": "train", "step": 10, "loss": 0.71, "lr": 0.003, "samples_per_s": 1234.5},
    {"kind": "train", "step": 20, "loss": 0.52, "lr": 0.002, "samples_per_s": 1301.0},
    {"kind": "eval", "step": 20, "loss": 0.49, "accuracy": 0.81, "exact": True},
    {"kind": "train", "step": 30, "loss": 0.43, "lr": 0.001, "samples_per_s": 1290.0},
]


def _kwargs(run_name="run-a", **changes):
    """build_trackers' keywords: the run's name and the logger section's keys the trackers read."""
    settings = {"tracking_uri": None, "experiment": "clorch-test", "mode": "offline", **changes}
    return {"run_name": run_name, "settings": settings}


def _run_dir(tmp_path: Path) -> Path:
    run_dir = tmp_path / "outputs" / "2026-12-03" / "10-00-00"
    run_dir.mkdir(parents=True)
    for name, text in (("config.yaml", "seed: 7\n"), ("summary.json", '{"status": "succeeded"}')):
        (run_dir / name).write_text(text)
    return run_dir


def _artifacts(run_dir: Path) -> list[Path]:
    # loss.png is not written (no matplotlib here): a file given that does not exist is left out.
    return [run_dir / "config.yaml", run_dir / "summary.json", run_dir / "loss.png"]


def test_flatten_joins_keys_with_dots():
    assert flatten({"optim": {"lr": 1, "betas": [1, 2]}, "a": {}, "b": None}) == {
        "optim.lr": 1,
        "optim.betas": [1, 2],
        "a": {},
        "b": None,
    }


def test_default_tracking_uri_is_beside_the_run_directories(tmp_path):
    # Runs and sweep jobs share one store, beside outputs/ and multirun/ (not in them): MLflow 3's
    # own default kind, an SQLite file, which MLflow's tools open without extra settings.
    assert default_tracking_uri(tmp_path / "outputs" / "d" / "t") == f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep_job = tmp_path / "multirun" / "d" / "t" / "3"
    assert default_tracking_uri(sweep_job) == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert default_tracking_uri(tmp_path / "runs" / "r1") == f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    assert default_tracking_uri(tmp_path / "outputs").startswith("sqlite:////")


def test_run_name_is_the_path_below_the_root(tmp_path):
    assert run_name(tmp_path / "outputs" / "2026-12-03" / "10-00-00") == "2026-12-03/10-00-00"
    assert run_name(tmp_path / "multirun" / "2026-12-03" / "10-00-00" / "3") == "2026-12-03/10-00-00/3"
    assert run_name(tmp_path / "runs" / "r1") == "r1"


def test_missing_extras_names_the_pip_line(monkeypatch):
    monkeypatch.setattr(trackers, "find_spec", lambda module: None if module == "mlflow" else object())
    assert missing_extras(["mlflow", "wandb", "mlflow"]) == [
        "tracker mlflow needs the mlflow-skinny package: pip install 'clorch[mlflow]' "
        "(in a clorch checkout: pip install '.[mlflow]')"
    ]
    assert missing_extras(["comet"]) == ["unknown tracker 'comet'; allowed: mlflow, wandb"]
    monkeypatch.setattr(trackers, "find_spec", lambda module: object())
    assert missing_extras(["wandb", "mlflow"]) == []


def test_wandb_auto_mode_is_online_only_with_an_api_key(tmp_path, monkeypatch):
    for key in ("WANDB_API_KEY", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_wandb_mode("auto") == "offline"
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password abc\n")
    assert resolve_wandb_mode("auto") == "online"
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.com")
    assert resolve_wandb_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "abc")
    assert resolve_wandb_mode("auto") == "online"
    assert resolve_wandb_mode("disabled") == "disabled"
    with pytest.raises(ValueError, match="wandb mode must be one of auto, online, offline, disabled, got 'on'"):
        resolve_wandb_mode("on")
    with pytest.raises(ValueError, match="unknown tracker 'comet'; allowed: mlflow, wandb"):
        build_trackers(["comet"], tmp_path, **_kwargs())


@pytest.mark.timeout(60)
def test_mlflow_holds_the_params_metrics_artifacts_and_status(tmp_path, monkeypatch, caplog):
    mlflow = pytest.importorskip("mlflow")
    import mlflow.utils.validation  # noqa: F811 (the submodule, for its limits)

    for key in ("MLFLOW_ALLOW_FILE_STORE", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(key, raising=False)
    run_dir = _run_dir(tmp_path)
    (a,) = build_trackers(["mlflow"], run_dir, **_kwargs())
    (b,) = build_trackers(["mlflow"], run_dir, **_kwargs(run_name="run-b"))
    a.start(CONFIG)
    b.start({"seed": 8})
    for record in RECORDS:  # interleaved: each call goes to its own run
        a.log(record)
        b.log({**record, "loss": record["loss"] + 1})
    a.finish("completed", _artifacts(run_dir))
    b.finish("failed", [run_dir / "config.yaml"])
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ  # set for the trackers' calls only
    assert caplog.records == []

    client = mlflow.MlflowClient(default_tracking_uri(run_dir))  # MLflow's own reader, no opt-in
    run = client.get_run(a.run_id)
    assert run.info.run_name == "run-a" and run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "clorch-test"
    assert run.data.tags["clorch.run_dir"] == str(run_dir)
    limit = mlflow.utils.validation.MAX_PARAM_VAL_LENGTH  # a longer value is cut to fit
    expected = {
        k: (json.dumps(v) if isinstance(v, list) else str(v)) for k, v in flatten(CONFIG).items() if v is not None
    }
    expected["notes"] = "x" * (limit - 3) + "..."
    assert run.data.params == expected
    for kind, key in (("train", "loss"), ("train", "samples_per_s"), ("eval", "accuracy")):
        history = client.get_metric_history(a.run_id, f"{kind}/{key}")
        assert [(m.step, m.value) for m in history] == [(r["step"], r[key]) for r in RECORDS if r["kind"] == kind]
    assert "eval/exact" not in run.data.metrics and "train/step" not in run.data.metrics
    assert sorted(f.path for f in client.list_artifacts(a.run_id)) == ["config.yaml", "summary.json"]
    assert run.info.artifact_uri.startswith((tmp_path / "mlartifacts").as_uri())  # beside the store

    other = client.get_run(b.run_id)
    assert other.info.status == "FAILED" and other.data.params == {"seed": "8"}
    assert [m.value for m in client.get_metric_history(b.run_id, "train/loss")] == [1.71, 1.52, 1.43]
    assert [f.path for f in client.list_artifacts(b.run_id)] == ["config.yaml"]


def test_the_trackers_follow_their_own_environment_variables_when_the_config_names_nothing(tmp_path, monkeypatch):
    run_dir = _run_dir(tmp_path)
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_PROJECT", "WANDB_DIR"):
        monkeypatch.delenv(key, raising=False)
    unset = _kwargs(experiment=None)
    mlflow, wandb = build_trackers(["mlflow", "wandb"], run_dir, **unset)
    assert (mlflow.tracking_uri, mlflow.experiment) == (default_tracking_uri(run_dir), "clorch")
    assert (wandb.project, wandb.directory) == ("clorch", run_dir)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example.com:5000")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "team-exp")
    monkeypatch.setenv("WANDB_PROJECT", "team-project")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    mlflow, wandb = build_trackers(["mlflow", "wandb"], run_dir, **unset)
    assert (mlflow.tracking_uri, mlflow.experiment) == ("http://mlflow.example.com:5000", "team-exp")
    assert mlflow.artifact_location is None  # the server's store decides where files go
    assert (wandb.project, wandb.directory) == ("team-project", tmp_path / "wandb-dir")
    # What the config names wins over the environment.
    mlflow, wandb = build_trackers(["mlflow", "wandb"], run_dir, **_kwargs(tracking_uri="sqlite:////x.db"))
    assert (mlflow.tracking_uri, mlflow.experiment, wandb.project) == ("sqlite:////x.db", "clorch-test", "clorch-test")


def test_the_sqlite_store_without_sqlalchemy_warns_with_the_pip_line(tmp_path, monkeypatch, caplog):
    pytest.importorskip("mlflow")
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(key, raising=False)
    real = mlflow_tracker.find_spec
    monkeypatch.setattr(mlflow_tracker, "find_spec", lambda module: None if module == "alembic" else real(module))
    (tracker,) = build_trackers(["mlflow"], _run_dir(tmp_path), **_kwargs())
    with caplog.at_level(logging.WARNING, logger="clorch.trackers"):
        tracker.start(CONFIG)
    (warning,) = caplog.records
    assert "needs alembic beside mlflow-skinny: pip install 'clorch[mlflow]'" in warning.getMessage()
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.timeout(30)
def test_an_unreachable_server_warns_once_and_the_run_goes_on(tmp_path, monkeypatch, caplog):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    with socket.socket() as s:  # a port nothing listens on: the connection is refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_dir = _run_dir(tmp_path)
    (tracker,) = build_trackers(["mlflow"], run_dir, **_kwargs(tracking_uri=f"http://127.0.0.1:{port}"))
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="clorch.trackers"):
        tracker.start(CONFIG)
        for record in RECORDS:
            tracker.log(record)
        tracker.finish("completed", _artifacts(run_dir))
    assert time.monotonic() - began < 10
    assert tracker.disabled
    (warning,) = caplog.records
    assert warning.getMessage().startswith("mlflow tracker: start failed (MlflowException: ")
    assert f"127.0.0.1:{port}" in warning.getMessage()
    assert warning.getMessage().endswith("it is off for the rest of this run, training goes on")


@pytest.mark.timeout(60)
def test_a_failure_midway_turns_the_tracker_off(tmp_path, monkeypatch, caplog):
    pytest.importorskip("mlflow")
    (tracker,) = build_trackers(["mlflow"], _run_dir(tmp_path), **_kwargs())
    tracker.start(CONFIG)
    calls = []

    def broken(*args, **kwargs):
        calls.append(args)
        raise ConnectionError("server went away")

    monkeypatch.setattr(tracker._client, "log_batch", broken)
    monkeypatch.setattr(tracker._client, "set_terminated", broken)
    with caplog.at_level(logging.WARNING, logger="clorch.trackers"):
        for record in RECORDS:
            tracker.log(record)
        tracker.finish("completed", [])
    assert len(calls) == 1  # the first log; the later logs and finish never reach the client
    assert [r.getMessage() for r in caplog.records] == [
        "mlflow tracker: log failed (ConnectionError: server went away); it is off for the rest of this "
        "run, training goes on"
    ]


@pytest.mark.timeout(10)
def test_an_interrupted_start_turns_the_tracker_off_an_interrupted_log_does_not(tmp_path, monkeypatch, caplog):
    (tracker,) = build_trackers(["mlflow"], _run_dir(tmp_path), **_kwargs())

    def interrupted(*args):
        raise KeyboardInterrupt  # what clorch's Interrupted (SIGINT, SIGTERM, SIGHUP) is

    monkeypatch.setattr(tracker, "_log", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tracker.log(RECORDS[0])
    assert not tracker.disabled  # the record is sent again with the next call
    monkeypatch.setattr(tracker, "_start", interrupted)
    with caplog.at_level(logging.WARNING, logger="clorch.trackers"), pytest.raises(KeyboardInterrupt):
        tracker.start(CONFIG)
    assert tracker.disabled
    assert [r.getMessage() for r in caplog.records] == [
        "mlflow tracker: start interrupted; it is off for the rest of this run"
    ]


@pytest.fixture
def wandb_home(tmp_path, monkeypatch):
    """W&B's caches and settings in tmp_path; its service process stopped afterwards."""
    wandb = pytest.importorskip("wandb")
    for name in ("CONFIG_DIR", "CACHE_DIR", "DATA_DIR", "ARTIFACT_DIR"):
        monkeypatch.setenv(f"WANDB_{name}", str(tmp_path / "wandb-home" / name.lower()))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    yield wandb
    wandb.teardown()


@pytest.mark.timeout(60)
def test_wandb_offline_writes_the_run_under_run_dir(tmp_path, wandb_home):
    run_dir = _run_dir(tmp_path)
    (tracker,) = build_trackers(["wandb"], run_dir, **_kwargs())
    tracker.start(CONFIG)
    for record in RECORDS:
        tracker.log(record)
    tracker.finish("completed", _artifacts(run_dir))
    assert not any(k in os.environ for k in ("WANDB_SILENT", "WANDB_CONSOLE"))  # the calls' own

    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    (log,) = offline.glob("run-*.wandb")
    assert sorted(p.name for p in (offline / "files" / "clorch").iterdir()) == ["config.yaml", "summary.json"]
    assert (run_dir / "config.yaml").read_text() == "seed: 7\n" and not (run_dir / "config.yaml").is_symlink()

    def name(item):
        return item.key or "/".join(item.nested_key)

    records = wandb_records_once_written(log)
    (run,) = [r.run for r in records if r.HasField("run")]
    config = {name(u): json.loads(u.value_json) for u in run.config.update}
    assert run.display_name == "run-a" and run.project == "clorch-test"
    assert {k: config[k] for k in CONFIG} == CONFIG
    rows = {}
    for r in records:
        if r.HasField("history"):
            items = {name(i): json.loads(i.value_json) for i in r.history.item}
            rows[items.pop("_step")] = {k: v for k, v in items.items() if not k.startswith("_")}
    expected = {}
    for record in RECORDS:
        step, numbers = trackers.record_metrics(record)
        expected.setdefault(step, {}).update(numbers)
    assert rows == expected
    (end,) = [r.exit for r in records if r.HasField("exit")]
    assert end.exit_code == 0


@pytest.mark.timeout(30)
def test_wandb_that_cannot_start_warns_once(tmp_path, wandb_home, monkeypatch, caplog):
    def refused(**kwargs):
        raise wandb_home.errors.UsageError("No API key configured. Use `wandb login` to log in.")

    monkeypatch.setattr(wandb_home, "init", refused)
    (tracker,) = build_trackers(["wandb"], _run_dir(tmp_path), **_kwargs(mode="online"))
    with caplog.at_level(logging.WARNING, logger="clorch.trackers"):
        tracker.start(CONFIG)
        tracker.log(RECORDS[0])
        tracker.finish("failed", [])
    assert [r.getMessage() for r in caplog.records] == [
        "wandb tracker: start failed (UsageError: No API key configured. Use `wandb login` to log in.); "
        "it is off for the rest of this run, training goes on"
    ]


@pytest.mark.timeout(60)
def test_wandb_offline_follows_wandb_dir_project_and_entity(tmp_path, wandb_home, monkeypatch):
    run_dir = _run_dir(tmp_path)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("WANDB_PROJECT", "team-project")
    monkeypatch.setenv("WANDB_ENTITY", "team")
    (tracker,) = build_trackers(["wandb"], run_dir, **_kwargs(experiment=None))
    tracker.start(CONFIG)
    assert (tracker.run.project, tracker.run.entity) == ("team-project", "team")
    tracker.finish("completed", [])
    assert not (run_dir / "wandb").exists()
    (offline,) = (tmp_path / "elsewhere" / "wandb").glob("offline-run-*")
    assert list(offline.glob("run-*.wandb"))


@pytest.mark.timeout(60)
def test_a_sweep_opens_one_parent_run_its_trials_nest_under_and_groups_them_in_wandb(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    parent_keys = (
        "CLORCH_MLFLOW_PARENT_RUN_ID",
        "CLORCH_MLFLOW_PARENT_TRACKING_URI",
        "CLORCH_MLFLOW_PARENT_EXPERIMENT",
    )
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_RUN_GROUP", *parent_keys):
        monkeypatch.delenv(key, raising=False)
    sweep_dir = tmp_path / "multirun" / "2026-12-03" / "10-00-00"
    logger = {"trackers": ["mlflow", "wandb"], **_kwargs()["settings"]}
    env, close = trackers.sweep_environ(logger, sweep_dir)
    assert env["WANDB_RUN_GROUP"] == "2026-12-03/10-00-00"  # W&B groups the trials by sweep
    store = mlflow.MlflowClient(default_tracking_uri(sweep_dir / "0"))
    parent = store.get_run(env["CLORCH_MLFLOW_PARENT_RUN_ID"])
    assert (parent.info.run_name, parent.info.status) == ("2026-12-03/10-00-00", "RUNNING")
    assert store.get_experiment(parent.info.experiment_id).name == "clorch-test"  # the trials' experiment

    assert set(env) == {"WANDB_RUN_GROUP", *parent_keys}
    for key, value in env.items():  # what each trial gets
        monkeypatch.setenv(key, value)
    (nested,) = build_trackers(["mlflow"], sweep_dir / "0", **_kwargs(run_name="2026-12-03/10-00-00/0"))
    (elsewhere,) = build_trackers(["mlflow"], sweep_dir / "1", **_kwargs(experiment="other"))
    assert (nested.parent, elsewhere.parent) == (parent.info.run_id, None)  # MLflow nests within an experiment
    nested.start({"seed": 1})
    nested.finish("completed", [])
    assert store.get_run(nested.run_id).data.tags["mlflow.parentRunId"] == parent.info.run_id
    close("interrupted")
    assert store.get_run(parent.info.run_id).info.status == "KILLED"

    for key in env:
        monkeypatch.delenv(key)
    again, close = trackers.sweep_environ(logger, sweep_dir)  # the same sweep, continued
    assert again["CLORCH_MLFLOW_PARENT_RUN_ID"] == parent.info.run_id
    close("completed")
    assert store.get_run(parent.info.run_id).info.status == "FINISHED"
    assert trackers.sweep_environ({**logger, "trackers": []}, sweep_dir)[0] == {}
