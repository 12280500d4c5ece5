"""The sweepers' keys (`hydra.sweeper.*`), typed and checked before any trial starts.

`clorch-train -m` runs a sweep with one of two sweepers, chosen as Hydra chooses
them (`hydra/sweeper=NAME`):

    basic    (the default) Hydra's grid: every combination of the `a,b,c` lists, in order
    optuna   Optuna's search over Hydra's sweep grammar (clorch.sweep.space)

Their keys are those of Hydra's basic sweeper and of Hydra's Optuna sweeper plugin
where they mean the same, plus `n_jobs` for the grid and `objective`, `pruner`
and `space` for Optuna. conf/hydra/sweeper/*.yaml hold the same defaults (a test
keeps them equal). Nothing here names code: samplers and pruners are chosen by name.
Standard library and PyYAML only: the command line checks a sweep without torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SAMPLERS = ("tpe", "random", "grid", "cmaes", "qmc")
PRUNERS = ("none", "median", "hyperband")
DIRECTIONS = ("minimize", "maximize")
SWEEPERS = ("basic", "optuna")
STUDY_FILE = "optuna.db"  # the study's SQLite file in the sweep directory (no `storage` given)
# What a search-space file may hold: the space and how to search it, never where results go.
FILE_KEYS = ("params", "n_trials", "direction", "objective", "sampler", "pruner", "min_trials", "study_name")


@dataclass
class SamplerSettings:
    """`hydra/sweeper/sampler=NAME` (Hydra's convention) and `hydra.sweeper.sampler.seed`."""

    name: str = "tpe"  # tpe, random, grid, cmaes or qmc (Optuna's samplers of those names)
    seed: int | None = None  # the same seed gives the same trials (with n_jobs=1); null: random


@dataclass
class GridSettings:
    """`hydra/sweeper=basic`: Hydra's grid, run `n_jobs` trials at a time."""

    n_jobs: int = 1  # trials at once: each gets its own devices (GPUs) or cores (CPU)
    max_batch_size: int | None = None  # Hydra's basic sweeper key: jobs handed over at once
    params: dict[str, str] | None = None  # {key: "a,b,c"}: more sweep overrides


@dataclass
class OptunaSettings:
    """`hydra/sweeper=optuna`: the keys of Hydra's Optuna sweeper plugin, and clorch's own."""

    n_trials: int = 20  # trials in the study, those of an earlier run of the sweep included
    n_jobs: int = 1  # trials at once (asynchronously: a new one starts when one ends)
    direction: str = "minimize"  # minimize or maximize the objective
    objective: str | None = None  # the trial's metric: eval_loss when trials evaluate, else loss
    study_name: str | None = None  # null: the sweep directory's name
    storage: str | None = None  # an Optuna storage URL; null: SQLite in the sweep directory
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    pruner: str = "none"  # none, median (Optuna's MedianPruner) or hyperband
    min_trials: int = 5  # median: trials that finish before any is pruned (n_startup_trials)
    params: dict[str, str] | None = None  # {key: grammar}, as Hydra's Optuna sweeper takes them
    space: str | None = None  # a search-space file (YAML; FILE_KEYS), read before the sweep starts


def _int_error(key: str, value: Any, low: int) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        return f"hydra.sweeper.{key} must be an integer >= {low}, got {value!r}"
    return None


def _one_of(key: str, value: Any, allowed: tuple[str, ...]) -> str | None:
    if value not in allowed:
        return f"hydra.sweeper.{key}={value} is not allowed; choose one of: {', '.join(allowed)}"
    return None


def grid_errors(settings: GridSettings) -> list[str]:
    """Every error in the grid sweeper's keys."""
    return [e for e in [_int_error("n_jobs", settings.n_jobs, 1)] if e]


def optuna_errors(settings: OptunaSettings) -> list[str]:
    """Every error in the Optuna sweeper's keys (the search space is checked apart)."""
    s = settings
    seed = s.sampler.seed
    found = [
        _int_error("n_trials", s.n_trials, 1),
        _int_error("n_jobs", s.n_jobs, 1),
        _int_error("min_trials", s.min_trials, 0),
        _one_of("direction", s.direction, DIRECTIONS),
        _one_of("sampler", s.sampler.name, SAMPLERS),
        _one_of("pruner", s.pruner, PRUNERS),
        None if seed is None or _int_error("sampler.seed", seed, 0) is None else _int_error("sampler.seed", seed, 0),
    ]
    if s.objective is not None and (not isinstance(s.objective, str) or not s.objective):
        found.append(f"hydra.sweeper.objective must name a metric (loss, eval_loss, ...), got {s.objective!r}")
    return [e for e in found if e]


def from_mapping(cls: type, values: dict[str, Any], where: str = "hydra.sweeper") -> tuple[Any, list[str]]:
    """(an instance of settings class `cls` from `values`, every unknown key as an error)."""
    names = {f.name for f in dataclasses.fields(cls)}
    errors = [
        f"{where}.{key} is not a key of this sweeper; it takes: {', '.join(sorted(names))}"
        for key in values
        if key not in names and key != "_target_"
    ]
    kwargs = {k: v for k, v in values.items() if k in names}
    if cls is OptunaSettings and isinstance(kwargs.get("sampler"), dict):
        sampler, more = from_mapping(SamplerSettings, kwargs["sampler"], f"{where}.sampler")
        kwargs["sampler"], errors = sampler, errors + more
    elif cls is OptunaSettings and isinstance(kwargs.get("sampler"), str):  # hydra.sweeper.sampler=random
        kwargs["sampler"] = SamplerSettings(name=kwargs["sampler"])
    return cls(**kwargs), errors


def read_space_file(path: str | Path) -> tuple[dict[str, Any], list[str]]:
    """(a search-space file's settings, every error). A search-space file is data, like a
    recipe: it holds FILE_KEYS only (no `storage`, no `_target_`, no Hydra keys)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        return {}, [f"hydra.sweeper.space={path}: cannot read it ({exc.strerror or exc})"]
    except yaml.YAMLError as exc:
        return {}, [f"hydra.sweeper.space={path} is not YAML: {str(exc).splitlines()[0]}"]
    if data is None:
        data = {}
    if not isinstance(data, dict):
        return {}, [f"hydra.sweeper.space={path} must hold a mapping of {', '.join(FILE_KEYS)}"]
    errors = []
    for key in data:
        if key == "storage":
            errors.append(
                f"{path}: storage is not allowed in a search-space file (a shared file must not say where "
                "results go); set hydra.sweeper.storage on the command line"
            )
        elif key not in FILE_KEYS:
            errors.append(f"{path}: {key} is not allowed in a search-space file; it takes: {', '.join(FILE_KEYS)}")
    params = data.get("params") or {}
    if not isinstance(params, dict):
        errors.append(f"{path}: params must map keys to sweep grammar, got {type(params).__name__}")
        params = {}
    for key, value in params.items():
        if "_target_" in str(key).split(".") or str(key).split(".")[0].split("/")[0] == "hydra":
            errors.append(f"{path}: params.{key} is not allowed: a search space may not name code or Hydra keys")
    data = {**data, "params": {str(k): _grammar(v) for k, v in params.items()}}
    return {k: v for k, v in data.items() if k in FILE_KEYS}, errors


def _grammar(value: Any) -> str:
    """A search-space file's value as grammar text: a YAML list is a choice."""
    if isinstance(value, list):
        return "choice(" + ", ".join(str(v) for v in value) + ")"
    return str(value)
