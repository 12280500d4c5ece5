"""The sweepers' keys (`hydra.sweeper.*`), typed and checked before any trial starts.

`clorch-train -m` runs a sweep with one of two sweepers, chosen as Hydra chooses
them (`hydra/sweeper=NAME`):

    basic    (the default) Hydra's grid: every combination of the `a,b,c` lists, in order
    optuna   Optuna's search over Hydra's sweep grammar (clorch.sweep.space)

Their keys are those of Hydra's basic sweeper and of Hydra's Optuna sweeper plugin
where they mean the same, plus `n_jobs` for the grid and `objective`, `pruner`
and `space` for Optuna. conf/hydra/sweeper/*.yaml hold the same defaults (a test
keeps them equal). Nothing here names code: samplers and pruners are chosen by name.
Neither torch nor Optuna is imported: the command line checks a sweep without them
(SQLAlchemy, Optuna's own dependency, only when a storage URL is given).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from clorch.sweep.algorithms import (
    PRUNERS,
    SAMPLERS,
    PrunerSettings,
    SamplerSettings,
    choice_errors,
    pruner_of,
)
from clorch.sweep.objectives import as_list, objective_errors
from clorch.sweep.space import param_key_error

SWEEPERS = ("basic", "optuna")
STUDY_FILE = "optuna.db"  # the study's SQLite file in the sweep directory (no `storage` given)
# What a search-space file may hold: the space and how to search it, never where results go.
FILE_KEYS = (
    "params",
    "n_trials",
    "direction",
    "objective",
    "sampler",
    "pruner",
    "min_trials",
    "study_name",
    "repeatable",
    "timeout",
    "enqueue",
    "warm_start",
)
MAX_SPACE_FILE = 1 << 20  # bytes: a larger search-space file is refused before it is read


@dataclass
class GridSettings:
    """`hydra/sweeper=basic`: Hydra's grid, run `n_jobs` trials at a time."""

    n_jobs: int = 1  # trials at once: each gets its own devices (GPUs) or cores (CPU)
    trials_per_gpu: int | str = 1  # trials that may share one GPU; auto: by the plan's memory estimate
    max_batch_size: int | None = None  # Hydra's basic sweeper key: jobs handed over at once
    params: dict[str, str] | None = None  # {key: "a,b,c"}: more sweep overrides
    continue_changed: bool = False  # continue a sweep directory that holds another sweep (sweep.json)


@dataclass
class OptunaSettings:
    """`hydra/sweeper=optuna`: the keys of Hydra's Optuna sweeper plugin, and clorch's own."""

    n_trials: int = 20  # trials in the study, those of an earlier run of the sweep included
    n_jobs: int = 1  # trials at once (asynchronously: a new one starts when one ends)
    # Trials that may share one GPU when n_jobs > 1 (clorch.sweep.gpu_share); auto: as many as the GPU's
    # memory holds by the plan's estimate of the trials' largest. No effect without GPUs.
    trials_per_gpu: int | str = 1
    direction: str | list[str] = "minimize"  # minimize or maximize the objective; a list: one per objective
    # the trial's metric: eval_loss when trials evaluate, else loss; a list: several (clorch.sweep.objectives)
    objective: str | list[str] | None = None
    study_name: str | None = None  # null: the sweep directory's name
    storage: str | None = None  # an Optuna storage URL; null: SQLite in the sweep directory
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    # none, median (Optuna's MedianPruner) or hyperband; or a mapping of its name and arguments,
    # {name: median, n_warmup_steps: 10} (clorch.sweep.algorithms): read it through `pruning()`
    pruner: str | PrunerSettings = "none"
    min_trials: int = 5  # median: trials that finish before any is pruned (pruner.n_startup_trials wins)
    params: dict[str, str] | None = None  # {key: grammar}, as Hydra's Optuna sweeper takes them
    continue_changed: bool = False  # continue a sweep directory that holds another sweep (sweep.json)
    space: str | None = None  # a search-space file (YAML; FILE_KEYS), read before the sweep starts
    # Trial k is asked, and pruned, against the trials numbered k - n_jobs and below, once they have
    # ended (clorch.sweep.study): a seeded sweep then repeats itself whatever order its trials end in.
    # null: true when sampler.seed is given; false: against whatever has ended (Optuna's way).
    repeatable: bool | None = None
    # Seconds from the sweep's start (Optuna's optimize(timeout=)): no new trial starts after them, the
    # running ones finish. A continued sweep has a budget of its own. null: no budget.
    timeout: float | None = None
    # Trials the study asks first, in order ({key: value} of searched keys; Optuna's enqueue_trial), once:
    # a continued sweep's study holds them already (clorch.sweep.enqueue). null: none.
    enqueue: list[dict[str, Any]] | None = None
    # Another sweep directory of the Optuna sweeper: its finished trials are added to this study before the
    # first trial, for the sampler to start from; they are not run, counted in n_trials, nor this sweep's
    # best (clorch.sweep.warm_start). A relative path is the working directory's. null: none.
    warm_start: str | None = None

    def objectives(self) -> list[str | None]:
        """The objective (None: the default) or the several, as a list."""
        return as_list(self.objective)

    def directions(self) -> list[str]:
        """The direction of each objective."""
        return as_list(self.direction)

    def pruning(self) -> PrunerSettings:
        """The pruner and its arguments, `min_trials` as the median pruner's n_startup_trials unless given."""
        return pruner_of(self.pruner, self.min_trials)

    def repeats(self) -> bool:
        """Whether this sweep's trials are asked and pruned by the fixed rule (`repeatable`)."""
        return self.sampler.seed is not None if self.repeatable is None else bool(self.repeatable)


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
    found = [_int_error("n_jobs", settings.n_jobs, 1), _bool_error(settings.continue_changed)]
    return [e for e in [*found, per_gpu_error(settings.trials_per_gpu)] if e]


def per_gpu_error(value: Any) -> str | None:
    """hydra.sweeper.trials_per_gpu: an integer >= 1, or auto."""
    if value == "auto" or _int_error("trials_per_gpu", value, 1) is None:
        return None
    return f"hydra.sweeper.trials_per_gpu must be an integer >= 1 or auto, got {value!r}"


def _bool_error(value: Any, key: str = "continue_changed") -> str | None:
    if not isinstance(value, bool):
        return f"hydra.sweeper.{key} must be true or false, got {value!r}"
    return None


def optuna_errors(settings: OptunaSettings) -> list[str]:
    """Every error in the Optuna sweeper's keys (the search space is checked apart)."""
    s = settings
    seed = s.sampler.seed
    found = [
        _int_error("n_trials", s.n_trials, 1),
        _int_error("n_jobs", s.n_jobs, 1),
        per_gpu_error(s.trials_per_gpu),
        _int_error("min_trials", s.min_trials, 0),
        _one_of("sampler", s.sampler.name, SAMPLERS),
        None if seed is None or _int_error("sampler.seed", seed, 0) is None else _int_error("sampler.seed", seed, 0),
    ]
    found += objective_errors(s.objective, s.direction, s.pruning().name, s.sampler.name)
    found += [_bool_error(s.continue_changed), _repeatable_error(s), _sampler_package_error(s.sampler.name)]
    found += [_timeout_error(s.timeout), _asha_order_error(s), _warm_start_error(s.warm_start)]
    found += choice_errors(s.sampler, s.pruner, repeats=_repeatable_error(s) is None and s.repeats())
    return [e for e in found if e] + storage_errors(s.storage)


def _asha_order_error(settings: OptunaSettings) -> str | None:
    """ASHA pauses and promotes trials in the order they reach their rungs, which trials side by
    side change from run to run: a repeatable sweep cannot have both."""
    if settings.pruning().name != "asha" or settings.n_jobs == 1 or _repeatable_error(settings) is not None:
        return None
    if not settings.repeats():
        return None
    return (
        f"hydra.sweeper.pruner=asha with hydra.sweeper.n_jobs={settings.n_jobs} pauses and promotes trials in the "
        "order they reach their rungs, which no fixed rule can repeat (hydra.sweeper.repeatable, true when "
        "sampler.seed is given): set hydra.sweeper.repeatable=false, or n_jobs=1"
    )


def _warm_start_error(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and value):
        return None
    return f"hydra.sweeper.warm_start must be another sweep's directory (its hydra.sweep.dir) or null, got {value!r}"


def _timeout_error(value: Any) -> str | None:
    if value is None or (not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value < math.inf):
        return None
    return (
        f"hydra.sweeper.timeout must be a number of seconds > 0 (no new trial starts after it) or null, got {value!r}"
    )


def _sampler_package_error(name: str) -> str | None:
    """A sampler whose package is optional in Optuna and missing here (found now, not at the first trial)."""
    if name == "cmaes" and importlib.util.find_spec("cmaes") is None:
        return "hydra.sweeper.sampler=cmaes needs the cmaes package, which is not installed: pip install cmaes"
    return None


def _repeatable_error(settings: OptunaSettings) -> str | None:
    value = settings.repeatable
    if value is not None and not isinstance(value, bool):
        return f"hydra.sweeper.repeatable must be true, false or null (true when sampler.seed is given), got {value!r}"
    if value is True and settings.sampler.seed is None:
        return (
            "hydra.sweeper.repeatable=true needs hydra.sweeper.sampler.seed: an unseeded sampler asks other "
            "trials each run; set sampler.seed=INT"
        )
    return None


STORAGE_EXAMPLES = "e.g. sqlite:////abs/path/optuna.db or postgresql://user@host/db"


def storage_errors(url: Any) -> list[str]:
    """Every error in `hydra.sweeper.storage`, found before the sweep starts: a database URL as
    SQLAlchemy reads them (Optuna's RDBStorage), of a dialect SQLAlchemy knows, whose driver is
    installed and is not asyncio's; no `?plugin=` (which loads code into the sweep); SQLite in a
    file whose directory exists (an in-memory database is not shared with the trials)."""
    if url is None:
        return []
    if not isinstance(url, str) or not url:
        return [f"hydra.sweeper.storage must be a database URL ({STORAGE_EXAMPLES}), got {url!r}"]
    # lazy: SQLAlchemy (Optuna's dependency) only for a sweep that names a storage
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return [f"hydra.sweeper.storage={url} is not a database URL (DIALECT[+DRIVER]://...; {STORAGE_EXAMPLES})"]
    where = f"hydra.sweeper.storage={parsed.render_as_string(hide_password=True)}"
    if "plugin" in parsed.query:
        return [f"{where}: ?plugin= is not allowed (it loads code into the sweep); leave it out"]
    try:
        dialect = parsed.get_dialect()
        (getattr(dialect, "import_dbapi", None) or dialect.dbapi)()
    except NoSuchModuleError:
        return [f"{where}: {parsed.drivername} is not a database SQLAlchemy knows ({STORAGE_EXAMPLES})"]
    except ImportError as exc:
        return [f"{where}: its driver {exc.name or exc} is not installed; install it, or use sqlite:////PATH"]
    if getattr(dialect, "is_async", False):
        return [f"{where}: {parsed.drivername} is an asyncio driver; Optuna needs a blocking one ({STORAGE_EXAMPLES})"]
    return _sqlite_errors(where, parsed)


def _sqlite_errors(where: str, parsed: Any) -> list[str]:
    if parsed.get_backend_name() != "sqlite":
        return []
    database = parsed.database or ""
    if database in ("", ":memory:") or "mode=memory" in database:
        return [f"{where} is a database in memory, which the trials' processes cannot reach ({STORAGE_EXAMPLES})"]
    if database.startswith("file:"):  # an SQLite URI (?uri=true): SQLite reads it
        return []
    folder = Path(database).parent
    if not folder.is_dir():
        return [f"{where}: the folder {folder} does not exist; create it, or name a file in an existing folder"]
    return []


def from_mapping(cls: type, values: dict[str, Any], where: str = "hydra.sweeper") -> tuple[Any, list[str]]:
    """(an instance of settings class `cls` from `values`, every unknown key as an error).

    The sweeper's own `_target_` (its class, which Hydra's config names) is passed over; one
    within it (`sampler._target_`) is an error: samplers are chosen by name."""
    names = {f.name for f in dataclasses.fields(cls)}
    kind, choices = ("pruner", PRUNERS) if cls is PrunerSettings else ("sampler", SAMPLERS)
    of = "this sweeper" if cls in (OptunaSettings, GridSettings) else f"the {kind}"
    errors = [
        f"{where}.{key} is not allowed: {kind}s are chosen by name, {where}.name=NAME (one of: {', '.join(choices)})"
        if key == "_target_"
        else f"{where}.{key} is not a key of {of}; it takes: {', '.join(sorted(names))}"
        for key in values
        if key not in names and not (key == "_target_" and where == "hydra.sweeper")
    ]
    kwargs = {k: v for k, v in values.items() if k in names}
    if cls is OptunaSettings and isinstance(kwargs.get("sampler"), dict):
        sampler, more = from_mapping(SamplerSettings, kwargs["sampler"], f"{where}.sampler")
        kwargs["sampler"], errors = sampler, errors + more
    elif cls is OptunaSettings and isinstance(kwargs.get("sampler"), str):  # hydra.sweeper.sampler=random
        kwargs["sampler"] = SamplerSettings(name=kwargs["sampler"])
    if cls is OptunaSettings and isinstance(kwargs.get("pruner"), dict):  # {name: median, n_warmup_steps: 10}
        pruner, more = from_mapping(PrunerSettings, kwargs["pruner"], f"{where}.pruner")
        kwargs["pruner"], errors = pruner, errors + more
    return cls(**kwargs), errors


def read_space_file(path: str | Path) -> tuple[dict[str, Any], list[str]]:
    """(a search-space file's settings, every error). A search-space file is data, like a
    recipe: it holds FILE_KEYS only (no `storage`, no `_target_` at any depth, no Hydra keys),
    and is read only when it is a regular file of at most MAX_SPACE_FILE bytes. What it holds
    in error is left out of the settings returned."""
    path = Path(path)
    data, errors = _load_space_file(path)
    if errors:
        return {}, errors
    if data is None:
        data = {}
    if not isinstance(data, dict):
        return {}, [f"hydra.sweeper.space={path} must hold a mapping of {', '.join(FILE_KEYS)}"]
    nested = {k: v for k, v in data.items() if k not in ("params", "_target_")}  # those two: below
    errors = [f"{path}: {key} is not allowed: a search-space file never names code" for key in _code_keys(nested)]
    for key in data:
        if key == "storage":
            errors.append(
                f"{path}: storage is not allowed in a search-space file (a shared file must not say where "
                "results go); set hydra.sweeper.storage on the command line"
            )
        elif key not in FILE_KEYS:
            errors.append(f"{path}: {key} is not allowed in a search-space file; it takes: {', '.join(FILE_KEYS)}")
    sampler, more = _file_sampler(path, data.get("sampler"))
    params, most = _file_params(path, data.get("params"))
    data = {**data, "params": params, **({"sampler": sampler} if "sampler" in data else {})}
    return {k: v for k, v in data.items() if k in FILE_KEYS}, errors + more + most


def _load_space_file(path: Path) -> tuple[Any, list[str]]:
    """(a search-space file's YAML, every error), read only as a regular file of at most
    MAX_SPACE_FILE bytes (a device such as /dev/zero, or a pipe, never ends), without YAML
    aliases (`*name`, which can make a small file hold a huge document)."""
    where = f"hydra.sweeper.space={path}"
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            return None, [f"{where} is not a regular file; a search-space file is a YAML file"]
        if info.st_size > MAX_SPACE_FILE:
            return None, [f"{where} holds {info.st_size:,} bytes; a search-space file holds at most {MAX_SPACE_FILE:,}"]
        with path.open("rb") as file:
            raw = file.read(MAX_SPACE_FILE + 1)
    except OSError as exc:
        return None, [f"{where}: cannot read it ({exc.strerror or exc})"]
    if len(raw) > MAX_SPACE_FILE:  # it grew since it was measured
        return None, [f"{where} holds more than {MAX_SPACE_FILE:,} bytes; a search-space file holds at most that"]
    try:
        return yaml.load(raw.decode("utf-8"), Loader=_SpaceLoader), []
    except UnicodeDecodeError:
        return None, [f"{where} is not UTF-8 text"]
    except _AliasError:
        return None, [f"{where} uses a YAML alias (*name); a search-space file writes each value out"]
    except RecursionError:
        return None, [f"{where} nests its YAML too deeply"]
    except yaml.YAMLError as exc:
        return None, [f"{where} is not YAML: {str(exc).splitlines()[0]}"]


class _AliasError(Exception):
    pass


class _SpaceLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing aliases."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise _AliasError
        return super().compose_node(parent, index)


def _code_keys(data: Any, where: str = "") -> list[str]:
    """The dotted paths of every `_target_` key in a loaded YAML document (the top level's
    included), where Hydra would import and call what it names."""
    found = []
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{where}{key}"
            if "_target_" in str(key).lstrip("+~").split("."):
                found.append(path)
            found += _code_keys(value, f"{path}.")
    elif isinstance(data, list):
        for index, value in enumerate(data):
            found += _code_keys(value, f"{where}{index}.")
    return found


def _file_sampler(path: Path, sampler: Any) -> tuple[Any, list[str]]:
    """(a space file's `sampler`, without keys it may not hold; every error naming the file)."""
    if not isinstance(sampler, dict):
        return sampler, []
    names = [f.name for f in dataclasses.fields(SamplerSettings)]
    errors = [
        f"{path}: sampler.{key} is not a key of the sampler; it takes: {', '.join(names)} "
        f"(e.g. sampler: {{name: tpe, seed: 0}}; name is one of: {', '.join(SAMPLERS)})"
        for key in sampler
        if key not in names and key != "_target_"
    ]
    return {k: v for k, v in sampler.items() if k in names}, errors


def _file_params(path: Path, params: Any) -> tuple[dict[str, str], list[str]]:
    """(a space file's `params` as {key: grammar text}, every error naming the file and the key)."""
    if params is None:
        return {}, []
    if not isinstance(params, dict):
        return {}, [f"{path}: params must map keys to sweep grammar, got {type(params).__name__}"]
    out, errors = {}, []
    for key, value in params.items():
        key = str(key)
        error = param_key_error(key, f"{path}: ") or _mapping_error(path, key, value)
        if error:
            errors.append(error)
        else:
            out[key] = _grammar(value)
    return out, errors


def _mapping_error(path: Path, key: str, value: Any) -> str | None:
    """An error for a mapping where a space file's param takes one grammar string or a list."""
    if not isinstance(value, dict):
        return None
    if value and set(map(str, value)) <= {"low", "high", "log", "step"}:
        low, high = value.get("low", "LOW"), value.get("high", "HIGH")
        form = f"interval({low}, {high})"
        return (
            f"{path}: params.{key} is a mapping ({', '.join(map(str, value))}); a range is written in Hydra's "
            f"grammar: {key}: {form}, or {key}: tag(log, {form}) on a log scale"
        )
    first = next(iter(value), "KEY")
    return (
        f"{path}: params.{key} is a mapping; a search space takes one dotted key per parameter, with its "
        f"grammar as the value: {key}.{first}: tag(log, interval(1e-4, 1e-1)), or a YAML list for a choice"
    )


def _grammar(value: Any) -> str:
    """A search-space file's value as grammar text: a YAML list is a choice."""
    if isinstance(value, list):
        return "choice(" + ", ".join(str(v) for v in value) + ")"
    return str(value)
