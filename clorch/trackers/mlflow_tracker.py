"""The mlflow tracker: a run's config, metrics and files in an MLflow run (`logger.trackers=[mlflow]`).

MlflowClient with an explicit run id (two runs in one process never share the fluent API's
global run). The store is `logger.tracking_uri`, else MLFLOW_TRACKING_URI, else MLflow 3's
default, an SQLite file mlflow.db beside outputs/ and multirun/ (`mlflow_target`): `mlflow ui`
run there shows it. The experiment: `logger.experiment`, else MLFLOW_EXPERIMENT_NAME, else
"clorch". The package is the `mlflow` extra (mlflow-skinny, with sqlalchemy and alembic for
the SQLite store), imported when the tracker starts.

Sweeps: `clorch-train -m` opens one parent run named after the sweep directory, in the store
and experiment its trials use (`MLflowTracker.sweep_environ`), and each trial's run becomes its
child (the tag mlflow.parentRunId, which MLflow's UI nests by). The sweep hands the parent to
its trials through CLORCH_MLFLOW_PARENT_RUN_ID, with the parent's store and experiment in
CLORCH_MLFLOW_PARENT_TRACKING_URI and CLORCH_MLFLOW_PARENT_EXPERIMENT: a trial whose logger
names another store or experiment (a sweep over logger.tracking_uri) is not nested, as MLflow
nests runs of one experiment only. Setting CLORCH_MLFLOW_PARENT_RUN_ID alone nests any run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
import warnings
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from clorch.trackers.base import (
    DEFAULT_EXPERIMENT,
    HYDRA_ROOTS,
    BaseTracker,
    Extra,
    flatten,
    record_metrics,
    register,
    run_name,
)

# clorch's end states (the brief's and summary.json's) -> MLflow's RunStatus; anything else: FAILED.
MLFLOW_STATUS = {
    "completed": "FINISHED",
    "succeeded": "FINISHED",
    "failed": "FAILED",
    "interrupted": "KILLED",
    "stopped": "KILLED",
    "killed": "KILLED",
}
# What mlflow-skinny lacks for the SQLite store (the default one): the mlflow extra installs them.
SQL_STORE_MODULES = ("sqlalchemy", "alembic")
# A sweep's parent run, as its trials get it (`MLflowTracker.sweep_environ`).
PARENT_RUN_ID = "CLORCH_MLFLOW_PARENT_RUN_ID"
PARENT_TRACKING_URI = "CLORCH_MLFLOW_PARENT_TRACKING_URI"
PARENT_EXPERIMENT = "CLORCH_MLFLOW_PARENT_EXPERIMENT"
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own tag: its UI and search nest a run under this one


def default_tracking_uri(run_dir: Path) -> str:
    """The MLflow store for runs that name none: `sqlite:////abs/path/mlflow.db` beside outputs/
    and multirun/.

    The store is beside the first ancestor of `run_dir` named outputs/ or multirun/
    (Hydra's default roots), so every run and sweep job of a project lands in one
    store; elsewhere in `run_dir`'s parent. Beside the roots, not in them: the store
    holds copies of config.yaml and summary.json, which `clorch-runs` would list as runs.
    The runs' files go to `mlartifacts/` beside it (`default_artifact_location`).

    Why SQLite: it is MLflow 3's own default (`sqlite:///mlflow.db`), the store
    that `mlflow ui` and MlflowClient open without extra settings; the older file
    store (`mlruns/`) is in maintenance mode and refused unless
    MLFLOW_ALLOW_FILE_STORE=true. It needs sqlalchemy and alembic beside
    mlflow-skinny: the `mlflow` extra installs them.
    """
    return f"sqlite:///{_store_root(run_dir) / 'mlflow.db'}"


def default_artifact_location(run_dir: Path) -> str:
    """Where a new experiment of the default store keeps its runs' files: `mlartifacts/` beside
    the store (without it MLflow would pick `./mlruns` in whatever directory the run started from)."""
    return (_store_root(run_dir) / "mlartifacts").as_uri()


def _store_root(run_dir: Path) -> Path:
    run_dir = Path(run_dir).resolve()
    return next((p.parent for p in run_dir.parents if p.name in HYDRA_ROOTS), run_dir.parent)


def mlflow_target(tracking_uri: str | None, experiment: str | None, run_dir: Path) -> tuple[str, str]:
    """MLflow's store and experiment for a run, by MLflow's own conventions.

    The store: `tracking_uri` (logger.tracking_uri); when null, MLFLOW_TRACKING_URI
    when set; else `default_tracking_uri(run_dir)`. The experiment: `experiment`
    (logger.experiment); when null, MLFLOW_EXPERIMENT_NAME when set; else "clorch".
    """
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(run_dir)
    return uri, experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT


def parent_run_id(tracking_uri: str, experiment: str) -> str | None:
    """The run a run in `tracking_uri`'s `experiment` is a child of: CLORCH_MLFLOW_PARENT_RUN_ID,
    unless CLORCH_MLFLOW_PARENT_TRACKING_URI or CLORCH_MLFLOW_PARENT_EXPERIMENT names another
    store or experiment (a child must be in its parent's experiment for MLflow to nest it)."""
    run_id = os.environ.get(PARENT_RUN_ID)
    store = os.environ.get(PARENT_TRACKING_URI, tracking_uri), os.environ.get(PARENT_EXPERIMENT, experiment)
    return run_id if run_id and store == (tracking_uri, experiment) else None


@register
class MLflowTracker(BaseTracker):
    """An MLflow run through MlflowClient and its run id. Rank 0 only; never raises (see BaseTracker)."""

    name = "mlflow"
    extra = Extra("mlflow", "mlflow-skinny")
    # The store keeps copies of a run's files (config.yaml, summary.json): mlartifacts/ beside the
    # default mlflow.db, mlruns/ a file store. mlflow.db is a file, never taken for a run.
    folders = ("mlartifacts", "mlruns")
    logger_keys = ("tracking_uri", "experiment")

    def __init__(
        self, tracking_uri: str, experiment: str, run_name: str, run_dir: Path, artifact_location: str | None = None
    ):
        super().__init__()
        self.tracking_uri, self.experiment, self.run_name = tracking_uri, experiment, run_name
        self.run_dir = Path(run_dir)
        self.artifact_location = artifact_location  # for an experiment created here; None: MLflow's choice
        self.run_id: str | None = None
        self.parent: str | None = None  # the run this one is a child of (a sweep's parent run)
        self._client: Any = None

    @classmethod
    def from_settings(cls, run_dir: Path, run_name: str, settings: Mapping[str, Any]) -> MLflowTracker:
        """The run's tracker: the store and experiment `mlflow_target` finds for the logger's
        `tracking_uri` and `experiment`; new experiments of the default store keep their files
        in mlartifacts/ beside it."""
        uri, experiment = mlflow_target(settings["tracking_uri"], settings["experiment"], run_dir)
        location = default_artifact_location(run_dir) if uri == default_tracking_uri(run_dir) else None
        tracker = cls(uri, experiment, run_name, run_dir, location)
        tracker.parent = parent_run_id(uri, experiment)
        return tracker

    @classmethod
    def sweep_environ(
        cls, sweep_dir: Path, settings: Mapping[str, Any]
    ) -> tuple[dict[str, str], Callable[[str], None]]:
        """Open the sweep's parent run (or reopen it, for a sweep continued in the same directory),
        named after `sweep_dir`, where its trials' runs will be; return the trials' environment
        that makes each run its child, and the function that closes it as the sweep's status.

        A parent that cannot be opened warns once (as a run's tracker does) and the trials run
        without one. Called by the sweep's process, once, before its first trial.
        """
        # Trial 0's directory: the default store is found from a run directory (beside its root).
        parent = _SweepParent.from_settings(sweep_dir / "0", run_name(sweep_dir), settings)
        parent.run_dir = Path(sweep_dir)  # its tag clorch.run_dir: found again by it
        parent.start({})
        if parent.run_id is None:
            return {}, lambda status: None
        env = {PARENT_RUN_ID: parent.run_id, PARENT_TRACKING_URI: parent.tracking_uri}
        return {**env, PARENT_EXPERIMENT: parent.experiment}, lambda status: parent.finish(status, [])

    def _env(self) -> Mapping[str, str]:
        # A file store named by the user (file:///path/mlruns): MLflow 3 keeps it in maintenance
        # mode and refuses it without this opt-in; readers of that store need it set as well.
        return {"MLFLOW_ALLOW_FILE_STORE": "true"} if self.tracking_uri.startswith("file:") else {}

    def _start(self, params: dict[str, Any]) -> None:
        with _quiet_store():
            self._open(params)

    def _open(self, params: dict[str, Any]) -> None:
        from mlflow import MlflowClient  # lazy: mlflow is optional and slow to import (about 1.5 s)

        missing = [m for m in SQL_STORE_MODULES if find_spec(m) is None]
        if self.tracking_uri.startswith("sqlite:") and missing:
            raise ModuleNotFoundError(
                f"the SQLite store {self.tracking_uri} needs {' and '.join(missing)} "
                "beside mlflow-skinny: pip install 'clorch[mlflow]'"
            )
        self._client = MlflowClient(tracking_uri=self.tracking_uri)
        self.run_id = self._new_run(self._experiment_id(), {"clorch.run_dir": str(self.run_dir.resolve())})
        # lazy: mlflow is optional (clorch[mlflow])
        from mlflow.entities import Param

        flat = [Param(_key(k), _param_value(v)) for k, v in flatten(params).items() if v is not None]
        for i in range(0, len(flat), 100):  # MLflow takes at most 100 params a batch
            self._client.log_batch(self.run_id, params=flat[i : i + 100])

    def _new_run(self, experiment_id: str, tags: dict[str, str]) -> str:
        if self.parent:
            tags = {**tags, PARENT_TAG: self.parent}
        return self._client.create_run(experiment_id, run_name=self.run_name, tags=tags).info.run_id

    def _experiment_id(self) -> str:
        found = self._client.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        try:
            return self._client.create_experiment(self.experiment, artifact_location=self.artifact_location)
        except Exception:  # another run created it meanwhile (a sweep's jobs start together)
            found = self._client.get_experiment_by_name(self.experiment)
            if found is None:
                raise
            return found.experiment_id

    def _log(self, record: dict[str, Any]) -> None:
        # lazy: mlflow is optional (clorch[mlflow])
        from mlflow.entities import Metric

        step, numbers = record_metrics(record)
        now = int(time.time() * 1000)
        metrics = [Metric(_key(k), v, now, step) for k, v in numbers.items()]
        if metrics:
            self._client.log_batch(self.run_id, metrics=metrics)

    def _finish(self, status: str, artifacts: list[Path]) -> None:
        try:
            for path in artifacts:
                self._client.log_artifact(self.run_id, str(path))
        finally:  # a failed upload still closes the run, else it shows RUNNING forever
            self._client.set_terminated(self.run_id, status=MLFLOW_STATUS.get(status, "FAILED"))


class _SweepParent(MLflowTracker):
    """A sweep's parent run: no params, no metrics of its own; the run of an earlier start of the
    same sweep directory is opened again, so a continued sweep's trials join their siblings."""

    def _new_run(self, experiment_id: str, tags: dict[str, str]) -> str:
        value = tags["clorch.run_dir"].replace("\\", "\\\\").replace("'", "\\'")
        found = self._client.search_runs([experiment_id], f"tags.`clorch.run_dir` = '{value}'", max_results=1)
        if not found:
            return super()._new_run(experiment_id, tags)
        self._client.update_run(found[0].info.run_id, status="RUNNING")
        return found[0].info.run_id


@contextlib.contextmanager
def _quiet_store() -> Iterator[None]:
    """Without the SQLite store's chatter on the console: its INFO lines when it creates its
    tables (a new mlflow.db) and sqlalchemy's deprecation warnings about MLflow's own code."""
    store_logger = logging.getLogger("mlflow.store.db.utils")
    level = store_logger.level
    store_logger.setLevel(max(level, logging.WARNING))
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"mlflow\.store\.")
            yield
    finally:
        store_logger.setLevel(level)


def _key(name: str) -> str:
    # MLflow's names allow letters, digits, _ - . / and spaces; anything else would refuse the batch.
    return re.sub(r"[^\w\-./ ]", "_", name)


def _param_value(value: Any) -> str:
    # lazy: mlflow is optional (clorch[mlflow])
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH  # the client's own limit (6000 in 3.x)

    text = json.dumps(value, default=str) if isinstance(value, (list, tuple)) else str(value)
    return text if len(text) <= MAX_PARAM_VAL_LENGTH else text[: MAX_PARAM_VAL_LENGTH - 3] + "..."
