"""Experiment trackers: a run's metrics records forwarded to MLflow and Weights & Biases.

The records are metrics.jsonl's ({"kind": "train", "step": 10, "loss": 0.5, ...});
each tracker gets the run's config at `start`, every record through `log` and
the run's end through `finish`:

    mlflow   MlflowClient with an explicit run id (two runs in one process never share
             the fluent API's global run). The store is `tracking_uri`, else
             MLFLOW_TRACKING_URI, else MLflow 3's default, an SQLite file mlflow.db
             beside outputs/ and multirun/ (`mlflow_target`): `mlflow ui` run there
             shows it. The experiment: `experiment`, else MLFLOW_EXPERIMENT_NAME, else "clorch".
    wandb    wandb.init(mode=...): "offline" writes RUN_DIR/wandb/offline-run-*/ (upload
             later with `wandb sync RUN_DIR/wandb/offline-run-*`), "online" needs a login,
             "auto" is online when an API key is found (`resolve_wandb_mode`). The
             project: `experiment`, else WANDB_PROJECT, else "clorch"; WANDB_DIR moves
             wandb/ out of the run directory; WANDB_ENTITY is W&B's own (`wandb_target`).

Who calls: one process of the job (clorch.engine.tracking says which: the launching
process that follows rank 0's metrics.jsonl, or rank 0 once it has trained); nothing
here is a collective, no rank waits on it.

Failure isolation: a tracker whose call raises (a server down, a bad URI, a
missing login) logs one warning naming the tracker and the error and is off for
the rest of the run; `start`, `log` and `finish` never raise, so training goes on.
A tracker's calls are synchronous: a slow server slows the process that calls it,
never a training step.

The packages are optional extras (`pip install 'clorch[mlflow]'`, `'clorch[wandb]'`):
this module imports the standard library only; `missing_extras` checks them
without importing them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import netrc
import os
import re
import shutil
import time
import warnings
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence, runtime_checkable
from urllib.parse import urlparse

logger = logging.getLogger(__name__)

# name -> (the module it imports, the distribution that provides it)
EXTRAS = {"mlflow": ("mlflow", "mlflow-skinny"), "wandb": ("wandb", "wandb")}
TRACKERS = tuple(EXTRAS)
WANDB_MODES = ("auto", "online", "offline", "disabled")
# clorch's end states (the brief's and summary.json's) -> MLflow's RunStatus; anything else: FAILED.
MLFLOW_STATUS = {
    "completed": "FINISHED",
    "succeeded": "FINISHED",
    "failed": "FAILED",
    "interrupted": "KILLED",
    "stopped": "KILLED",
    "killed": "KILLED",
}
SUCCEEDED = ("completed", "succeeded")
HYDRA_ROOTS = ("outputs", "multirun")
DEFAULT_EXPERIMENT = "clorch"  # MLflow's experiment and W&B's project when neither config nor environment names one
# What mlflow-skinny lacks for the SQLite store (the default one): the mlflow extra installs them.
SQL_STORE_MODULES = ("sqlalchemy", "alembic")


@runtime_checkable
class Tracker(Protocol):
    """One experiment tracker of a run. Called by one process only (rank 0); never raises."""

    name: str

    def start(self, params: dict[str, Any]) -> None:
        """Open the tracker's run with the run's config (a nested dict)."""

    def log(self, record: dict[str, Any]) -> None:
        """Log a metrics record: each number but "step" as `{kind}/{key}` at `record["step"]`."""

    def finish(self, status: str, artifacts: Sequence[Path]) -> None:
        """Upload the `artifacts` that exist and close the run as `status` ("completed", ...)."""


def flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as one level with dotted keys: {"optim": {"lr": 1}} -> {"optim.lr": 1}."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def record_metrics(record: Mapping[str, Any]) -> tuple[int, dict[str, float]]:
    """A record's step and its numbers as `{kind}/{key}` (bools, strings and "step" left out)."""
    kind = record.get("kind", "train")
    numbers = {
        f"{kind}/{key}": float(value)
        for key, value in record.items()
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)
    }
    return int(record.get("step", 0)), numbers


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


def wandb_target(project: str | None, run_dir: Path) -> tuple[str, Path]:
    """W&B's project and directory for a run, by W&B's own conventions.

    The project: `project` (logger.experiment); when null, WANDB_PROJECT when set;
    else "clorch". The directory W&B writes its wandb/ folder in: WANDB_DIR when
    set, else the run directory. WANDB_ENTITY (the team or user) is W&B's own to read.
    """
    return (
        project or os.environ.get("WANDB_PROJECT") or DEFAULT_EXPERIMENT,
        Path(os.environ.get("WANDB_DIR") or run_dir),
    )


def run_name(run_dir: Path) -> str:
    """The run's name in the trackers: its path below outputs/ or multirun/ ("2026-12-03/10-00-00",
    a sweep's job "2026-12-03/10-00-00/3"), elsewhere the directory's own name.

    The name says where the run directory is, as `clorch-runs ls` shows it (less the root).
    """
    run_dir = Path(run_dir).resolve()
    root = next((p for p in run_dir.parents if p.name in HYDRA_ROOTS), None)
    return run_dir.relative_to(root).as_posix() if root is not None else run_dir.name


def missing_extras(names: Sequence[str]) -> list[str]:
    """One error line for each tracker in `names` whose package is not installed (or not known).

    Checked with importlib.util.find_spec, so nothing is imported (the packages are slow to).
    """
    errors = []
    for name in dict.fromkeys(names):
        if name not in EXTRAS:
            errors.append(f"unknown tracker {name!r}; allowed: {', '.join(TRACKERS)}")
            continue
        module, dist = EXTRAS[name]
        if find_spec(module) is None:
            errors.append(
                f"tracker {name} needs the {dist} package: pip install 'clorch[{name}]' "
                f"(in a clorch checkout: pip install '.[{name}]')"
            )
    return errors


def resolve_wandb_mode(mode: str) -> str:
    """ "auto": "online" when an API key is set (WANDB_API_KEY, or ~/.netrc / $NETRC for the
    W&B host, api.wandb.ai unless WANDB_BASE_URL names another), else "offline"; other modes
    are returned as they are. Raises ValueError for a mode not in WANDB_MODES."""
    if mode not in WANDB_MODES:
        raise ValueError(f"wandb mode must be one of {', '.join(WANDB_MODES)}, got {mode!r}")
    if mode != "auto":
        return mode
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    path = Path(os.environ.get("NETRC") or Path("~/.netrc").expanduser())
    try:
        found = path.is_file() and netrc.netrc(str(path)).authenticators(host or "") is not None
    except (OSError, netrc.NetrcParseError):
        found = False
    return "online" if found else "offline"


def build_trackers(
    names: Sequence[str],
    run_dir: Path,
    *,
    run_name: str,
    tracking_uri: str | None,
    experiment: str | None,
    wandb_mode: str,
    wandb_project: str | None,
) -> list[Tracker]:
    """The trackers `names` names, in that order (each once), none started yet.

    Args:
        names: tracker names from TRACKERS.
        run_dir: the run directory (W&B writes its wandb/ there unless WANDB_DIR is set;
            MLflow's default store is found from it).
        run_name: the name the run gets in the tracker's UI.
        tracking_uri: MLflow's store or server; None: see `mlflow_target`.
        experiment: MLflow's experiment name (created when missing); None: see `mlflow_target`.
        wandb_mode: one of WANDB_MODES ("auto" is resolved here).
        wandb_project: the W&B project; None: see `wandb_target`.

    Raises:
        ValueError: an unknown tracker name or W&B mode (packages are not checked here:
            see `missing_extras`).
    """
    trackers: list[Tracker] = []
    for name in dict.fromkeys(names):
        if name == "mlflow":
            uri, experiment_name = mlflow_target(tracking_uri, experiment, run_dir)
            location = default_artifact_location(run_dir) if uri == default_tracking_uri(run_dir) else None
            trackers.append(MLflowTracker(uri, experiment_name, run_name, run_dir, location))
        elif name == "wandb":
            project, directory = wandb_target(wandb_project, run_dir)
            trackers.append(WandbTracker(project, run_name, run_dir, resolve_wandb_mode(wandb_mode), directory))
        else:
            raise ValueError(f"unknown tracker {name!r}; allowed: {', '.join(TRACKERS)}")
    return trackers


@contextlib.contextmanager
def _env_defaults(values: Mapping[str, str]) -> Iterator[None]:
    """Set the variables the user has not set, for one call only (a library's switches are
    read from the environment; setting them for the whole process would change other code)."""
    added = [key for key in values if key not in os.environ]
    os.environ.update({key: values[key] for key in added})
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


class _Isolated:
    """A tracker's calls, each guarded: the first failure warns once and turns the tracker off."""

    name = "tracker"

    def __init__(self) -> None:
        self.disabled = False

    def _env(self) -> Mapping[str, str]:
        return {}

    def _guard(self, what: str, call: Callable[..., None], *args: Any) -> None:
        if self.disabled:
            return
        try:
            with _env_defaults(self._env()):
                call(*args)
        except Exception as exc:  # any library error: the run matters more than its tracking
            self.disabled = True
            logger.warning(
                "%s tracker: %s failed (%s: %s); it is off for the rest of this run, training goes on",
                self.name,
                what,
                type(exc).__name__,
                exc,
            )
        except KeyboardInterrupt:  # Ctrl-C, or clorch's Interrupted (SIGTERM, SIGHUP): the caller ends the run
            if what == "start":
                # Half open, and what made it slow (a server that does not answer) would make its
                # later calls as slow while the interrupted run writes its outputs. A cut-short log
                # or finish is called again instead (clorch.engine.tracking.TrackerFeed).
                self.disabled = True
                logger.warning("%s tracker: start interrupted; it is off for the rest of this run", self.name)
            raise

    def start(self, params: dict[str, Any]) -> None:
        self._guard("start", self._start, params)

    def log(self, record: dict[str, Any]) -> None:
        self._guard("log", self._log, record)

    def finish(self, status: str, artifacts: Sequence[Path]) -> None:
        self._guard("finish", self._finish, status, [Path(p) for p in artifacts if Path(p).is_file()])
        self.disabled = True  # the run is closed: later calls are no-ops

    def _start(self, params: dict[str, Any]) -> None:
        raise NotImplementedError

    def _log(self, record: dict[str, Any]) -> None:
        raise NotImplementedError

    def _finish(self, status: str, artifacts: list[Path]) -> None:
        raise NotImplementedError


class MLflowTracker(_Isolated):
    """An MLflow run through MlflowClient and its run id. Rank 0 only; never raises (see module)."""

    name = "mlflow"

    def __init__(
        self, tracking_uri: str, experiment: str, run_name: str, run_dir: Path, artifact_location: str | None = None
    ):
        super().__init__()
        self.tracking_uri, self.experiment, self.run_name = tracking_uri, experiment, run_name
        self.run_dir = Path(run_dir)
        self.artifact_location = artifact_location  # for an experiment created here; None: MLflow's choice
        self.run_id: str | None = None
        self._client: Any = None

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
        run = self._client.create_run(
            self._experiment_id(), run_name=self.run_name, tags={"clorch.run_dir": str(self.run_dir.resolve())}
        )
        self.run_id = run.info.run_id
        # lazy: mlflow is optional (clorch[mlflow])
        from mlflow.entities import Param

        flat = [Param(_key(k), _param_value(v)) for k, v in flatten(params).items() if v is not None]
        for i in range(0, len(flat), 100):  # MLflow takes at most 100 params a batch
            self._client.log_batch(self.run_id, params=flat[i : i + 100])

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


class WandbTracker(_Isolated):
    """A W&B run of its own (reinit="create_new"). Rank 0 only; never raises (see module).

    The run's console is not captured (clorch keeps logs/), git and code are not
    saved (env.json records the commit), and W&B prints nothing (WANDB_SILENT):
    each only where the user has not set the variable. Offline, nothing goes to
    the network (error reports are off too); system metrics are still sampled.
    The artifacts go into the run's files as clorch/NAME: W&B writes its own
    files/config.yaml when a run syncs, which a config.yaml of ours would collide with.
    """

    name = "wandb"

    def __init__(self, project: str, run_name: str, run_dir: Path, mode: str, directory: Path | None = None):
        super().__init__()
        self.project, self.run_name, self.run_dir, self.mode = project, run_name, Path(run_dir), mode
        self.directory = Path(directory or run_dir)  # where W&B writes its wandb/ folder
        self.run: Any = None

    def _env(self) -> Mapping[str, str]:
        env = {
            "WANDB_SILENT": "true",
            "WANDB_CONSOLE": "off",
            "WANDB_DISABLE_GIT": "true",
            "WANDB_DISABLE_CODE": "true",
        }
        if self.mode != "online":
            env["WANDB_ERROR_REPORTING"] = "false"
        return env

    def _start(self, params: dict[str, Any]) -> None:
        import wandb  # lazy: wandb is optional and slow to import (about 1.5 s)

        self.run = wandb.init(
            project=self.project,
            name=self.run_name,
            dir=str(self.directory),
            config=params,
            mode=self.mode,
            reinit="create_new",
        )

    def _log(self, record: dict[str, Any]) -> None:
        step, numbers = record_metrics(record)
        if numbers:
            self.run.log(numbers, step=step)

    def _finish(self, status: str, artifacts: list[Path]) -> None:
        try:
            if self.mode != "disabled":
                files = Path(self.run.dir)
                (files / "clorch").mkdir(exist_ok=True)
                for path in artifacts:
                    # A copy, not W&B's symlink: the run's files stay as they were at its end.
                    copy = shutil.copy2(path, files / "clorch" / path.name)
                    self.run.save(str(copy), base_path=str(files), policy="now")
        finally:
            self.run.finish(exit_code=0 if status in SUCCEEDED else 1)
