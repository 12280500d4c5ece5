"""Experiment trackers: a run's metrics records forwarded to MLflow, Weights & Biases, or any
tracker a module of this package registers.

The records are metrics.jsonl's ({"kind": "train", "step": 10, "loss": 0.5, ...});
each tracker gets the run's config at `start`, every record through `log` and
the run's end through `finish`:

    mlflow   mlflow_tracker.py: MlflowClient, a store beside outputs/ unless
             logger.tracking_uri or MLFLOW_TRACKING_URI names one (`mlflow_target`).
    wandb    wandb_tracker.py: wandb.init in logger.mode, offline without a login
             (`resolve_wandb_mode`), the project logger.experiment or WANDB_PROJECT.

Adding a tracker is one new module here (NAME_tracker.py): a `BaseTracker` subclass that
declares its name, its extra, the folders it writes and the logger keys it reads, and joins
with `@register` (clorch.trackers.base says how). Importing this package imports each of
its modules, so `TRACKERS`, `missing_extras`, `build_trackers` and `tracker_folders` know
the new tracker without a list to edit.

Sweeps (`clorch-train -m`): `sweep_environ` is called once by the sweep's process before its
first trial. MLflow opens a parent run named after the sweep directory and each trial's run is
its child; W&B groups the trials' runs by the sweep (each tracker's `sweep_environ` says how).

Who calls: one process of the job (clorch.engine.tracking says which: the launching
process that follows rank 0's metrics.jsonl, or rank 0 once it has trained); nothing
here is a collective, no rank waits on it.

Failure isolation: a tracker whose call raises (a server down, a bad URI, a
missing login) logs one warning naming the tracker and the error and is off for
the rest of the run; `start`, `log` and `finish` never raise, so training goes on.
A tracker's calls are synchronous: a slow server slows the process that calls it,
never a training step.

The packages are optional extras (`pip install 'clorch[mlflow]'`, `'clorch[wandb]'`):
this package imports the standard library only; `missing_extras` checks them
without importing them.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from clorch.trackers.base import (
    DEFAULT_EXPERIMENT,
    HYDRA_ROOTS,
    BaseTracker,
    Extra,
    Tracker,
    flatten,
    record_metrics,
    register,
    registered,
    run_name,
)
from clorch.trackers.mlflow_tracker import (
    MLflowTracker,
    default_artifact_location,
    default_tracking_uri,
    mlflow_target,
)
from clorch.trackers.wandb_tracker import WANDB_MODES, WandbTracker, resolve_wandb_mode, wandb_target

__all__ = [
    "DEFAULT_EXPERIMENT",
    "HYDRA_ROOTS",
    "TRACKERS",
    "WANDB_MODES",
    "BaseTracker",
    "Extra",
    "MLflowTracker",
    "Tracker",
    "WandbTracker",
    "build_trackers",
    "default_artifact_location",
    "default_tracking_uri",
    "discover",
    "flatten",
    "missing_extras",
    "mlflow_target",
    "record_metrics",
    "register",
    "registered",
    "resolve_wandb_mode",
    "run_name",
    "sweep_environ",
    "tracker_folders",
    "wandb_target",
]


def discover() -> tuple[str, ...]:
    """Import every module of this package (a tracker module registers its class as it is
    imported) and return the names of the registered trackers, sorted.

    Runs once as the package is imported (TRACKERS); modules already imported are not run again.
    A module whose name starts with "_" is skipped.
    """
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")
    return tuple(registered())


TRACKERS = discover()
"""The tracker names logger.trackers allows, sorted: ("mlflow", "wandb") and any module added here."""


def _unknown(name: str) -> str:
    return f"unknown tracker {name!r}; allowed: {', '.join(registered())}"


def missing_extras(names: Sequence[str]) -> list[str]:
    """One error line for each tracker in `names` whose package is not installed (or not known).

    Checked with importlib.util.find_spec, so nothing is imported (the packages are slow to).
    """
    errors = []
    known = registered()
    for name in dict.fromkeys(names):
        if name not in known:
            errors.append(_unknown(name))
            continue
        extra = known[name].extra
        if find_spec(extra.module) is None:
            install = (
                f"pip install 'clorch[{name}]' (in a clorch checkout: pip install '.[{name}]')"
                if extra.clorch_extra
                else f"pip install {extra.dist}"
            )
            errors.append(f"tracker {name} needs the {extra.dist} package: {install}")
    return errors


def build_trackers(names: Sequence[str], run_dir: Path, *, run_name: str, settings: Mapping[str, Any]) -> list[Tracker]:
    """The trackers `names` names, in that order (each once), none started yet.

    Args:
        names: tracker names from TRACKERS.
        run_dir: the run directory (W&B writes its wandb/ there unless WANDB_DIR is set;
            MLflow's default store is found from it).
        run_name: the name the run gets in the tracker's UI.
        settings: the `logger` config section as a mapping (tracking_uri, experiment, mode, ...);
            each tracker reads the keys its `logger_keys` names.

    Raises:
        ValueError: an unknown tracker name, settings without a key a tracker reads, or a
            value a tracker refuses (a W&B mode); packages are not checked here: see `missing_extras`.
    """
    known = registered()
    trackers: list[Tracker] = []
    for name in dict.fromkeys(names):
        if name not in known:
            raise ValueError(_unknown(name))
        cls = known[name]
        absent = [key for key in cls.logger_keys if key not in settings]
        if absent:
            raise ValueError(
                f"tracker {name} reads logger.{', logger.'.join(absent)}: missing from the settings "
                f"(given: {', '.join(settings) or 'none'})"
            )
        trackers.append(cls.from_settings(Path(run_dir), run_name, settings))
    return trackers


def tracker_folders() -> frozenset[str]:
    """The folders the registered trackers write in or beside run directories (mlartifacts,
    mlruns, wandb, ...): their copies of a run's files are not runs to clorch-runs."""
    return frozenset(folder for cls in registered().values() for folder in cls.folders)


def sweep_environ(logger: Mapping[str, Any], sweep_dir: Path) -> tuple[dict[str, str], Callable[[str], None]]:
    """What a sweep does for its trials' trackers, once, before its first trial (see the module).

    Args:
        logger: the sweep's composed `logger` section as a plain mapping (trackers, tracking_uri,
            experiment, mode, ...); a sweep over these keys gets what its base config names.
        sweep_dir: the sweep directory (SWEEP_DIR/N is trial N's run directory).

    Returns:
        The environment every trial gets (CLORCH_MLFLOW_PARENT_RUN_ID, WANDB_RUN_GROUP, ...; empty
        without trackers) and the function to call once at the sweep's end with its status
        ("completed", "interrupted" or "failed": MLflow's parent ends FINISHED, KILLED or FAILED).
        Neither this nor the function raises: a tracker that fails warns once and is left out.
    """
    env: dict[str, str] = {}
    closes: list[Callable[[str], None]] = []
    known = registered()
    for name in dict.fromkeys(logger.get("trackers") or ()):
        if name not in known:
            continue  # refused by the config's checks before any sweep starts
        try:
            extra, close = known[name].sweep_environ(Path(sweep_dir), logger)
        except Exception as exc:  # a key missing from `logger`, a refused W&B mode: the trials say it too
            logging.getLogger(__name__).warning(
                "%s tracker: the sweep's setup failed (%s: %s)", name, type(exc).__name__, exc
            )
            continue
        env.update(extra)
        closes.append(close)

    def close_all(status: str) -> None:
        for close in closes:
            close(status)

    return env, close_all
