"""A sweep's settings and search space, read from its command line and checked before any trial.

The sweeper's keys are read from the overrides as typed (`hydra/sweeper=optuna`,
`hydra/sweeper/sampler=random`, `hydra.sweeper.n_trials=8`, ...) over a
search-space file's (`hydra.sweeper.space=FILE`) over the defaults: the command
line wins. `clorch-train` calls `sweep_errors` before anything starts, and the
sweeper reads the same overrides again (Hydra hands it the command line's
hydra overrides), so both see one and the same sweep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from hydra.core.override_parser.overrides_parser import OverridesParser

from clorch.sweep.enqueue import enqueued_overrides, read_enqueue
from clorch.sweep.settings import (
    SWEEPERS,
    GridSettings,
    OptunaSettings,
    from_mapping,
    grid_errors,
    optuna_errors,
    read_space_file,
)
from clorch.sweep.slots import machine, plan_slots, ranks_per_trial
from clorch.sweep.space import MAX_GRID, SearchSpace, parse_space, sweep_size
from clorch.sweep.warm_source import source_errors


@dataclass
class Sweep:
    """A sweep as its command line describes it."""

    sweeper: str  # basic or optuna
    settings: GridSettings | OptunaSettings
    space: SearchSpace | None  # optuna: the searched parameters and the fixed overrides


def _is_sweeper_key(arg: str) -> bool:
    key = arg.partition("=")[0].lstrip("+~")
    return key == "hydra/sweeper" or key.startswith(("hydra/sweeper/", "hydra.sweeper"))


# The names clorch's sweepers have in conf/hydra/sweeper/: not Hydra's, whose own plugins (the
# Optuna sweeper plugin, if installed) register schemas under `basic` and `optuna` that Hydra
# would merge into any config file of the same name.
CONFIG_NAMES = {"basic": "clorch_grid", "grid": "clorch_grid", "optuna": "clorch_optuna"}


def chosen_sweeper(overrides: list[str]) -> str:
    """The sweeper the command line chooses (`hydra/sweeper=NAME`; basic by default)."""
    chosen = [a.partition("=")[2] for a in overrides if a.partition("=")[0].lstrip("+") == "hydra/sweeper"]
    name = chosen[-1] if chosen else "basic"
    return {"clorch_grid": "basic", "grid": "basic", "clorch_optuna": "optuna"}.get(name, name)


def as_hydra_overrides(overrides: list[str]) -> list[str]:
    """The command line's sweeper choices as clorch's config files name them: `hydra/sweeper=optuna`
    becomes `hydra/sweeper=clorch_optuna`, `hydra/sweeper/sampler=random` the key
    `hydra.sweeper.sampler.name=random`; a pruner's name and arguments one mapping
    (`_named_as_mapping`). Everything else is left as typed."""
    out = []
    for arg in _named_as_mapping(overrides, "pruner"):
        key, _, value = arg.partition("=")
        if key.lstrip("+") == "hydra/sweeper" and value in CONFIG_NAMES:
            out.append(f"hydra/sweeper={CONFIG_NAMES[value]}")
        elif key.lstrip("+") == "hydra/sweeper/sampler":
            out.append(f"hydra.sweeper.sampler.name={value}")
        else:
            out.append(arg)
    return out


def _named_as_mapping(overrides: list[str], name: str) -> list[str]:
    """`hydra.sweeper.NAME=median hydra.sweeper.NAME.n_warmup_steps=10` as the one override
    `hydra.sweeper.NAME={name: median, n_warmup_steps: 10}` (in place of the first), which Hydra
    composes over the config file's `NAME: none` (a string, which takes no keys of its own)."""
    key = f"hydra.sweeper.{name}"
    mine = [a for a in overrides if a.partition("=")[0].lstrip("+~") == key or a.lstrip("+~").startswith(f"{key}.")]
    plain = [a.partition("=")[2] for a in mine if a.partition("=")[0].lstrip("+~") == key]
    if not any(a.lstrip("+~").startswith(f"{key}.") for a in mine) or any(v.lstrip().startswith("{") for v in plain):
        return overrides
    items = {"name": plain[-1]} if plain else {}
    for arg in mine:
        head, _, value = arg.partition("=")
        if head.lstrip("+~") != key:
            items[head.lstrip("+~").removeprefix(f"{key}.")] = value
    merged = f"{key}={{{', '.join(f'{k}: {v}' for k, v in items.items())}}}"
    first = overrides.index(mine[0])
    return [*(a for a in overrides[:first]), merged, *(a for a in overrides[first:] if a not in mine)]


def _typed(arg: str) -> Any:
    """An override's value as Hydra's grammar types it (`8` an int, `null` None, `a` a string)."""
    (override,) = OverridesParser.create().parse_overrides([arg])
    return override.value()


def _mapping(overrides: list[str]) -> tuple[dict[str, Any], list[str]]:
    """{key: value} of the `hydra.sweeper.*` and `hydra/sweeper/sampler` overrides (nested)."""
    values: dict[str, Any] = {}
    errors: list[str] = []
    for arg in overrides:
        key = arg.partition("=")[0].lstrip("+~")
        if key == "hydra/sweeper/sampler":
            _put(values, ["sampler", "name"], arg.partition("=")[2])
            continue
        if not key.startswith("hydra.sweeper."):
            continue
        try:
            value = _typed(arg)
        except Exception as exc:  # Hydra's grammar error
            errors.append(
                f"{arg}: {str(exc).strip().splitlines()[0]}; a value with '=', spaces, commas or brackets is "
                f"quoted for Hydra inside the shell's quotes: '{arg.partition('=')[0]}=\"...\"'"
            )
            continue
        path = key.removeprefix("hydra.sweeper.").split(".")
        if path[0] == "params":  # {key: grammar}: the text as typed, or a quoted string's text, as Hydra's
            # composed config holds it ('hydra.sweeper.params.seed="1,2"': Hydra refuses a sweep unquoted)
            text = value if isinstance(value, str) else arg.partition("=")[2]
            values.setdefault("params", {})[".".join(path[1:])] = text
            continue
        _put(values, path, value)
    return values, errors


NAMED = ("sampler", "pruner")  # a name, or a mapping of its name and arguments


def _put(values: dict[str, Any], path: list[str], value: Any) -> None:
    """`value` at `path` in the nested `values`. A sampler's or pruner's name and its arguments
    meet in one mapping, in either order (`pruner=median pruner.n_warmup_steps=5`)."""
    if len(path) == 1 and path[0] in NAMED and isinstance(value, str) and isinstance(values.get(path[0]), dict):
        values[path[0]]["name"] = value
        return
    node = values
    for part in path[:-1]:
        if part in NAMED and node is values and isinstance(node.get(part), str):
            node[part] = {"name": node[part]}
        node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else {}
    node[path[-1]] = value


def _merged(file: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    out = {k: {"name": v} if k in NAMED and isinstance(v, str) else v for k, v in file.items()}
    for key, value in given.items():
        if key in NAMED and isinstance(value, str) and isinstance(out.get(key), dict):
            out[key] = {**out[key], "name": value}
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def grid_lines(overrides: list[str], params: dict[str, str] | None) -> list[str]:
    """The grid's overrides as its sweeper runs them (clorch.sweep.run.grid_jobs): `params`'s
    {key: "a,b"} first, then the command line's, without the sweeper's own keys."""
    return [f"{k}={v}" for k, v in (params or {}).items()] + [a for a in overrides if not _is_sweeper_key(a)]


def grid_size_errors(lines: list[str]) -> list[str]:
    """Every error of a grid's sweeps before any is listed: an interval (no values to list), or
    more than MAX_GRID combinations (ranges counted, not listed)."""
    errors: list[str] = []
    sizes: list[int] = []
    for line in lines:
        if line.partition("=")[0].lstrip("+~").replace("/", ".").split(".")[0] == "hydra":
            continue
        try:
            override = OverridesParser.create().parse_overrides([line])[0]
        except Exception:  # Hydra's grammar error: reported with the trial's checks
            continue
        if override.is_interval_sweep():
            errors.append(
                f"{override.input_line}: the grid (hydra/sweeper=basic) runs listed values, and an interval lists "
                f"none: search {override.key_or_group} with hydra/sweeper=optuna, or list values with choice(...) "
                "or range(...)"
            )
        size = sweep_size(override)
        sizes.append(1 if size is None else size)
    trials = math.prod(sizes)
    if trials > MAX_GRID:
        errors.append(
            f"the grid (hydra/sweeper=basic) holds {trials:,} trials{_factors(sizes)}; it runs at most "
            f"{MAX_GRID:,}: narrow it, or search with hydra/sweeper=optuna and hydra.sweeper.n_trials"
        )
    return errors


def _factors(sizes: list[int]) -> str:
    """` (200 x 100)`: the sizes of a grid's sweeps, where there are two or more."""
    factors = [f"{n:,}" for n in sizes if n > 1]
    return f" ({' x '.join(factors)})" if len(factors) > 1 else ""


def _read_grid(overrides: list[str], given: dict[str, Any], errors: list[str]) -> tuple[Sweep | None, list[str]]:
    grid_keys = ("n_jobs", "trials_per_gpu", "max_batch_size", "params", "continue_changed")
    bad = [f"hydra.sweeper.{k}" for k in given if k not in grid_keys]
    if "sampler" in given or bad:
        return None, [
            f"{', '.join(bad or ['hydra/sweeper/sampler'])} belongs to hydra/sweeper=optuna; the basic (grid) "
            "sweeper takes hydra.sweeper.n_jobs, trials_per_gpu, max_batch_size, params and continue_changed"
        ]
    settings, unknown = from_mapping(GridSettings, given)
    errors = errors + unknown + grid_errors(settings)
    params = settings.params if isinstance(settings.params, dict) else {}
    return Sweep("basic", settings, None), errors + grid_size_errors(grid_lines(overrides, params))


def _space_of(overrides: list[str], settings: OptunaSettings, file: dict[str, Any], given: dict[str, Any]) -> Any:
    """(the search space, every error in it): a key of the file's params is named with its file."""
    params = settings.params if isinstance(settings.params, dict) else {}
    origin = {k: str(given["space"]) for k in file.get("params") or {} if k not in (given.get("params") or {})}
    return parse_space([a for a in overrides if not _is_sweeper_key(a)], params, origin)


def _grid_sampler_errors(space: SearchSpace) -> list[str]:
    """Optuna's GridSampler lists every combination at its start: at most MAX_GRID."""
    sizes = [p.size() for p in space.params]
    if None in sizes or math.prod(sizes) <= MAX_GRID:
        return []  # an interval is reported above
    return [
        f"hydra/sweeper/sampler=grid lists {math.prod(sizes):,} combinations{_factors(sizes)}; it lists at "
        f"most {MAX_GRID:,}: narrow the ranges and choices, or choose another sampler (tpe, random, qmc)"
    ]


def _sweep_dir(overrides: list[str]) -> str | None:
    """The sweep directory the command line names (`hydra.sweep.dir=PATH`), or None (Hydra's default)."""
    found = [a for a in overrides if a.partition("=")[0].lstrip("+~") == "hydra.sweep.dir"]
    try:
        value = _typed(found[-1]) if found else None
    except Exception:  # Hydra's grammar error: Hydra reports it
        return None
    return value if isinstance(value, str) and value else None


def read_sweep(overrides: list[str]) -> tuple[Sweep | None, list[str]]:
    """(the sweep, every error in its sweeper keys, search-space file and search space).

    What is read stays bounded: a search-space file only as a regular file of at most
    MAX_SPACE_FILE bytes, ranges counted rather than listed, grids of at most MAX_GRID
    trials (clorch.sweep.space gives the space's own limits).
    """
    name = chosen_sweeper(overrides)
    if name not in SWEEPERS:
        return None, [f"hydra/sweeper={name} is not allowed; choose one of: {', '.join(SWEEPERS)}"]
    given, errors = _mapping(overrides)
    if name == "basic":
        return _read_grid(overrides, given, errors)
    file: dict[str, Any] = {}
    file_errors: list[str] = []
    if isinstance(given.get("space"), str):
        file, file_errors = read_space_file(given["space"])
        errors += file_errors
    settings, unknown = from_mapping(OptunaSettings, _merged(file, given))
    errors += unknown + optuna_errors(settings)
    errors += source_errors(settings.warm_start, settings.objective, settings.direction, _sweep_dir(overrides))
    space, space_errors = _space_of(overrides, settings, file, given)
    errors += space_errors
    if space is not None:
        where = "hydra.sweeper.enqueue" if "enqueue" in given else f"{given.get('space')}: enqueue"
        settings.enqueue, enqueue_errors = read_enqueue(settings.enqueue, space, settings.n_trials, where)
        errors += enqueue_errors
    if space is not None and not space.params and not file_errors:  # a file's wrong params: named above
        errors.append(
            "hydra/sweeper=optuna found nothing to search: give a search space, e.g. "
            "'optim.lr=tag(log, interval(1e-4, 1e-1))', 'batch_size=choice(16,32)', or hydra.sweeper.space=FILE"
        )
    if space is not None and settings.sampler.name == "grid":
        errors += [
            f"{p.key}: hydra/sweeper/sampler=grid searches choice(...) and range(...) only; an interval has no grid"
            for p in space.params
            if p.kind != "choice" and p.step is None
        ]
        errors += _grid_sampler_errors(space)
    return Sweep(name, settings, space), errors


def sweep_errors(
    overrides: list[str],
    check: Callable[[list[str]], list[str]],
    compose_base: Callable[[list[str]], Any],
) -> list[str]:
    """Every error of a sweep before it starts: its keys, its space and each trial's config.

    Args:
        overrides: the command line's overrides (hydra's included).
        check: every error of one list of overrides (the grid's sweep lists expanded), as a
            single run's would be checked.
        compose_base: the composed config of one trial's overrides (None when it does not compose).
    """
    sweep, errors = read_sweep(overrides)
    if sweep is None or errors:
        return errors
    if sweep.sweeper == "basic":  # the grid's own lists: check_overrides composes up to its limit of them
        trial_lists = [grid_lines(overrides, sweep.settings.params)]
    else:  # the space's representative values, then each enqueued trial
        trial_lists = sweep.space.representative_overrides() + enqueued_overrides(sweep.space, sweep.settings.enqueue)
    for trial in trial_lists:
        errors += [e for e in check(trial) if e not in errors]
    if errors:
        return errors
    base = compose_base([a for a in trial_lists[0] if not a.partition("=")[0].lstrip("+").startswith("hydra")])
    if base is None:
        return errors
    if sweep.sweeper == "optuna":
        errors += _pruning_errors(sweep.settings, base)
    if any(a.partition("=")[0].lstrip("+") == "hydra/launcher" and not a.endswith("=basic") for a in overrides):
        return errors  # submitit: each trial is a job of its own, on the resources it asks for
    per_gpu = sweep.settings.trials_per_gpu
    # auto: the sweep runs what the GPUs hold (clorch.sweep.gpu_share), never more
    return errors + slot_errors(sweep.settings.n_jobs, base, sweep.settings.n_jobs if per_gpu == "auto" else per_gpu)


def _pruning_errors(settings: OptunaSettings, base: Any) -> list[str]:
    """A pruner needs an eval metric as the objective, and trials that evaluate before their end."""
    pruner = settings.pruning().name
    objective = settings.objective if isinstance(settings.objective, str) else None  # several: never pruned
    errors = []
    if pruner != "none" and objective and not objective.startswith("eval_"):
        errors.append(
            f"hydra.sweeper.pruner={pruner} prunes on an eval metric, but hydra.sweeper.objective="
            f"{objective} is not one (eval_loss, eval_accuracy, ...): choose an eval_ metric or pruner=none"
        )
    if pruner != "none" and not base.get("eval_every"):
        errors.append(
            f"hydra.sweeper.pruner={pruner} stops trials at their evals, but they evaluate only at "
            "the end (eval_every=0): set eval_every, e.g. eval_every=20"
        )
    elif pruner == "asha":
        errors += _asha_rung_errors(settings.pruning(), base)
    return errors


def _asha_rung_errors(pruner: Any, base: Any) -> list[str]:
    """ASHA's rungs are evals: min_resource (and so every rung, min_resource x reduction_factor^k)
    is a multiple of eval_every, and the first rung comes before the trial's last step."""
    every, first, last = base.get("eval_every"), pruner.min_resource, base.get("max_steps")
    if isinstance(first, bool) or not isinstance(first, int) or not isinstance(every, int):
        return []  # the default (a multiple of eval_every), or a wrong type (reported with the keys)
    errors = []
    if first % every:
        below, above = first // every * every, (first // every + 1) * every
        near = f"{below} or {above}" if below else str(above)
        errors.append(
            f"hydra.sweeper.pruner.min_resource={first} is not a multiple of eval_every={every}: ASHA's rungs "
            f"are evals (min_resource x reduction_factor^k steps); set min_resource to {near}, or eval_every "
            f"to a divisor of {first}"
        )
    if isinstance(last, int) and first >= last:
        errors.append(
            f"hydra.sweeper.pruner.min_resource={first} is not below max_steps={last}: ASHA's first rung must "
            f"come before the trial's last step; set min_resource below {last}, or leave it out (the default: "
            "max_steps / reduction_factor^2, down to a multiple of eval_every)"
        )
    return errors


def slot_errors(n_jobs: int, base: Any, per_gpu: int = 1) -> list[str]:
    """Whether `n_jobs` trials of the composed config `base` fit this machine at once, `per_gpu`
    of them on each GPU (`auto` runs what the GPUs hold: clorch.sweep.gpu_share)."""
    if n_jobs == 1:
        return []
    gpus, cores = machine()
    launcher = base.get("launcher") or {}
    if launcher.get("name") != "local":
        return [f"hydra.sweeper.n_jobs={n_jobs} packs trials of clorch's own launcher (launcher=local)"]
    ranks = ranks_per_trial(launcher.get("nproc_per_node"), n_jobs, gpus, cores, per_gpu)
    try:
        plan_slots(n_jobs, ranks, gpus, cores, per_gpu)
    except ValueError as exc:
        return [str(exc)]
    return []
