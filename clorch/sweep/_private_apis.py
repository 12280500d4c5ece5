"""Every private API of Hydra and Optuna that clorch's sweep leans on, in one room.

Each name below relies on something its library does not promise. One test per
assumption (tests/sweep/test_study_private_apis.py) checks it against the installed
version, so an upgrade that breaks one breaks that test, not a sweep. Nothing else in
clorch imports `hydra._internal` or reads `_trial_id` (tests/test_layers.py holds that).

    Hydra
      BASIC_SWEEPER       the class path of Hydra's basic sweeper, as a config's _target_ names it
      grid_combinations   BasicSweeper.split_arguments: every combination of a grid, in the
                          order Hydra's basic sweeper numbers its jobs
      runs_in_process     Hydra's BasicLauncher: the launcher that runs each job in this process
    Optuna
      trial_id            the storage's id of a trial (Trial._trial_id, FrozenTrial._trial_id),
                          which a trial's ranks and the heartbeats address it by

Public APIs do the rest: each trial's seeded sampler comes with a study object of its own
(optuna.load_study), not by rebinding `study.sampler`; a repeatable sweep's view of a study
(the trials a trial is asked and pruned on) is a storage of its own, a subclass of Optuna's
BaseStorage (clorch.train.trial.trials_up_to), not a patched study.
"""

from __future__ import annotations

from typing import Any

from hydra._internal.core_plugins.basic_launcher import BasicLauncher
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.types import Override

BASIC_SWEEPER = f"{BasicSweeper.__module__}.{BasicSweeper.__name__}"


def grid_combinations(overrides: list[Override]) -> list[list[str]]:
    """Every combination of the parsed sweep `overrides`, as Hydra's basic sweeper orders its jobs."""
    return [list(job) for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]


def runs_in_process(launcher: Any) -> bool:
    """Whether Hydra's `launcher` runs each job in this process, one after another (Hydra's basic launcher).

    Compared by name: Hydra's plugin scan runs basic_launcher's module again when `Plugins`
    starts, so a BasicLauncher imported before then is not the class the launcher is made of.
    """
    cls, basic = type(launcher), BasicLauncher
    return (cls.__module__, cls.__qualname__) == (basic.__module__, basic.__qualname__)


def trial_id(trial: Any) -> int:
    """The storage's id of an Optuna Trial or FrozenTrial (its number counts within its study only)."""
    return int(trial._trial_id)
