"""What every tracker shares: the `Tracker` protocol, `BaseTracker` (each call guarded), the
registry the tracker modules join with `@register`, and the helpers records and names go through.

A tracker module of this package (mlflow_tracker.py, wandb_tracker.py) holds one class:

    @register
    class MLflowTracker(BaseTracker):
        name = "mlflow"                                # logger.trackers' word for it
        extra = Extra("mlflow", "mlflow-skinny")       # the module it imports, the distribution
        folders = ("mlartifacts", "mlruns")            # what it writes in or beside a run directory
        logger_keys = ("tracking_uri", "experiment")   # the logger keys it reads

        @classmethod
        def from_settings(cls, run_dir, run_name, settings): ...

clorch.trackers imports every module of the package when it is imported, so the class is
registered without any list naming it. This module imports the standard library only, as
every tracker module must at its top: the tracker's package is imported inside its calls
(`# lazy:`), because clorch.config checks `logger.trackers` on every command line.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence, TypeVar, runtime_checkable

logger = logging.getLogger(__package__)  # clorch.trackers, for every tracker: the name users filter warnings on

HYDRA_ROOTS = ("outputs", "multirun")
DEFAULT_EXPERIMENT = "clorch"  # MLflow's experiment and W&B's project when neither config nor environment names one
SUCCEEDED = ("completed", "succeeded")  # clorch's end states (the brief's and summary.json's) that are a success


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


@dataclass(frozen=True)
class Extra:
    """The optional package a tracker needs, checked without importing it (`missing_extras`).

    Attributes:
        module: the module the tracker imports ("mlflow").
        dist: the distribution that provides it ("mlflow-skinny"), named in the error.
        clorch_extra: whether clorch's pyproject.toml has an extra of the tracker's name
            (`pip install 'clorch[NAME]'`); False: the error says `pip install DIST`.
    """

    module: str
    dist: str
    clorch_extra: bool = True


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


def run_name(run_dir: Path) -> str:
    """The run's name in the trackers: its path below outputs/ or multirun/ ("2026-12-03/10-00-00",
    a sweep's job "2026-12-03/10-00-00/3"), elsewhere the directory's own name.

    The name says where the run directory is, as `clorch-runs ls` shows it (less the root).
    """
    run_dir = Path(run_dir).resolve()
    root = next((p for p in run_dir.parents if p.name in HYDRA_ROOTS), None)
    return run_dir.relative_to(root).as_posix() if root is not None else run_dir.name


@contextlib.contextmanager
def env_defaults(values: Mapping[str, str]) -> Iterator[None]:
    """Set the variables the user has not set, for one call only (a library's switches are
    read from the environment; setting them for the whole process would change other code)."""
    added = [key for key in values if key not in os.environ]
    os.environ.update({key: values[key] for key in added})
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


class BaseTracker:
    """A tracker's calls, each guarded: the first failure warns once and turns the tracker off.

    A subclass declares `name`, `extra`, `folders` and `logger_keys` (see the module), builds
    itself in `from_settings`, and implements `_start`, `_log` and `_finish`; those may
    raise anything, `start`, `log` and `finish` never do (but an interrupt). `_env` names
    environment variables set for its calls only, where the user has not set them.
    """

    name: str = "tracker"
    extra: Extra
    folders: tuple[str, ...] = ()
    logger_keys: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.disabled = False

    @classmethod
    def from_settings(cls, run_dir: Path, run_name: str, settings: Mapping[str, Any]) -> BaseTracker:
        """The tracker of a run (not started): `settings` holds at least the keys `cls.logger_keys` names."""
        raise NotImplementedError

    @classmethod
    def sweep_environ(
        cls, sweep_dir: Path, settings: Mapping[str, Any]
    ) -> tuple[dict[str, str], Callable[[str], None]]:
        """What a sweep of runs with this tracker does once, before its first trial: the environment
        each trial gets (a parent run's id, a group's name) and a function the sweep calls at its end
        with its status ("completed", "interrupted", "failed"). By default nothing and a no-op.

        Args:
            sweep_dir: the sweep directory (each trial's run directory is SWEEP_DIR/N).
            settings: the sweep's `logger` section, as `from_settings` gets it.
        """
        return {}, _no_close

    def _env(self) -> Mapping[str, str]:
        return {}

    def _guard(self, what: str, call: Callable[..., None], *args: Any) -> None:
        if self.disabled:
            return
        try:
            with env_defaults(self._env()):
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


def _no_close(status: str) -> None:
    pass


_REGISTRY: dict[str, type[BaseTracker]] = {}
_Class = TypeVar("_Class", bound=type[BaseTracker])


def register(cls: _Class) -> _Class:
    """Class decorator: `cls` joins the trackers under `cls.name`. Returns `cls`.

    Raises:
        TypeError: `cls` lacks a declaration (name, extra, folders, logger_keys, from_settings).
        ValueError: another class has the name already.
    """
    where = f"{cls.__module__}.{cls.__qualname__}"
    name = cls.__dict__.get("name")
    if not isinstance(name, str) or not name.isidentifier():
        raise TypeError(f"tracker {where}: `name` must be a word (what logger.trackers names), got {name!r}")
    if not isinstance(getattr(cls, "extra", None), Extra):
        raise TypeError(f"tracker {where}: `extra` must be an Extra(module, dist), got {getattr(cls, 'extra', None)!r}")
    for attribute in ("folders", "logger_keys"):
        value = getattr(cls, attribute)
        if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
            raise TypeError(f"tracker {where}: `{attribute}` must be a tuple of names, got {value!r}")
    if cls.from_settings.__func__ is BaseTracker.from_settings.__func__:
        raise TypeError(f"tracker {where}: define the classmethod from_settings(run_dir, run_name, settings)")
    taken = _REGISTRY.get(name)
    if taken is not None and (taken.__module__, taken.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(
            f"tracker name {name!r} of {where} is taken by {taken.__module__}.{taken.__qualname__}; pick another name"
        )
    _REGISTRY[name] = cls  # the same class imported again (importlib.reload) replaces itself
    return cls


def registered() -> dict[str, type[BaseTracker]]:
    """Every registered tracker class by name, sorted by name."""
    return dict(sorted(_REGISTRY.items()))
