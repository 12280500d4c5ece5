"""The Optuna sweeper's samplers and pruners, chosen by name, with their arguments by name.

    hydra.sweeper.sampler.name=tpe  hydra.sweeper.sampler.n_startup_trials=5  (or hydra/sweeper/sampler=tpe)
    hydra.sweeper.pruner=median     hydra.sweeper.pruner.n_warmup_steps=10
    hydra.sweeper.pruner='{name: median, n_warmup_steps: 10}'                 (the same, in one override)

Each argument is Optuna's keyword of the same name (TPESampler, MedianPruner, HyperbandPruner;
asha, clorch's own, takes hyperband's min_resource and reduction_factor) and is checked
before the first trial: its type and bound, and that the chosen sampler or pruner takes it.
An argument left null is Optuna's default, but where clorch chooses: the median pruner's
`n_startup_trials` is `hydra.sweeper.min_trials`; TPE's `constant_liar` is on with trials side
by side unless the sweep is repeatable (clorch.sweep.study); asha's `min_resource` (see
PrunerSettings). Nothing here names code, and neither torch nor Optuna is imported.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

SAMPLERS = ("tpe", "random", "grid", "cmaes", "qmc")
PRUNERS = ("none", "median", "hyperband", "asha")
# Each argument: the samplers (pruners) that take it, and its rule: "bool", or the least int.
SAMPLER_ARGS: dict[str, tuple[tuple[str, ...], str | int]] = {
    "n_startup_trials": (("tpe", "cmaes"), 0),
    "multivariate": (("tpe",), "bool"),
    "group": (("tpe",), "bool"),
    "constant_liar": (("tpe",), "bool"),
}
PRUNER_ARGS: dict[str, tuple[tuple[str, ...], str | int]] = {
    "n_startup_trials": (("median",), 0),
    "n_warmup_steps": (("median",), 0),
    "interval_steps": (("median",), 1),
    "min_resource": (("hyperband", "asha"), 1),
    "reduction_factor": (("hyperband", "asha"), 2),
}


@dataclass
class SamplerSettings:
    """`hydra/sweeper/sampler=NAME` (Hydra's convention), `hydra.sweeper.sampler.seed` and its arguments."""

    name: str = "tpe"  # tpe, random, grid, cmaes or qmc (Optuna's samplers of those names)
    seed: int | None = None  # the same seed gives the same trials, whatever n_jobs (`repeatable`); null: random
    n_startup_trials: int | None = None  # tpe, cmaes: trials sampled at random first; null: Optuna's (10; cmaes 1)
    multivariate: bool | None = None  # tpe: model the parameters jointly; null: false
    group: bool | None = None  # tpe, with multivariate: model each group of parameters met together; null: false
    # tpe: count running trials as bad ones so that trials side by side differ; null: on with n_jobs > 1,
    # off in a repeatable sweep (whose trials are asked where none is running; true there is an error)
    constant_liar: bool | None = None

    def arguments(self) -> dict[str, Any]:
        """The arguments given (not null), by Optuna's keyword."""
        return {key: getattr(self, key) for key in SAMPLER_ARGS if getattr(self, key) is not None}


@dataclass
class PrunerSettings:
    """`hydra.sweeper.pruner`: a name, or a mapping of its name and arguments."""

    # none, median (Optuna's MedianPruner), hyperband (HyperbandPruner) or asha (clorch's lossless
    # ASHA: trials pause at rungs and are promoted to continue from their checkpoint, clorch.train.asha)
    name: str = "none"
    n_startup_trials: int | None = None  # median: trials that finish before any is pruned; null: min_trials
    n_warmup_steps: int | None = None  # median: steps a trial trains before it may be pruned; null: 0
    interval_steps: int | None = None  # median: prune at every this many steps (at an eval); null: 1
    # hyperband, asha: steps of the first rung; null: Optuna's estimate (hyperband), or the trials' last
    # step / reduction_factor^2 down to a multiple of eval_every (asha: clorch.train.asha.default_min_resource)
    min_resource: int | None = None
    reduction_factor: int | None = None  # hyperband, asha: 1/this of a rung's trials go on to the next; null: 3

    def arguments(self) -> dict[str, Any]:
        """The arguments given (not null), by Optuna's keyword."""
        return {key: getattr(self, key) for key in PRUNER_ARGS if getattr(self, key) is not None}


def _shown(value: Any) -> str:
    """A value as the command line writes it (true, not True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _rule_error(where: str, value: Any, rule: str | int) -> str | None:
    if rule == "bool":
        return None if isinstance(value, bool) else f"{where} must be true or false, got {value!r}"
    if isinstance(value, bool) or not isinstance(value, int) or value < rule:
        return f"{where} must be an integer >= {rule}, got {value!r}"
    return None


def argument_errors(kind: str, settings: SamplerSettings | PrunerSettings) -> list[str]:
    """Every error in a sampler's or pruner's arguments (`kind`: sampler or pruner): a wrong
    type or bound, or an argument that the chosen one does not take (naming which does)."""
    table = SAMPLER_ARGS if kind == "sampler" else PRUNER_ARGS
    errors = []
    for key, (takers, rule) in table.items():
        value = getattr(settings, key)
        if value is None:
            continue
        where = f"hydra.sweeper.{kind}.{key}"
        if settings.name not in takers:
            own = [k for k, (names, _) in table.items() if settings.name in names]
            plural = "s" if len(takers) > 1 else ""
            errors.append(
                f"{where}={_shown(value)} belongs to the {' and '.join(takers)} {kind}{plural}; "
                f"hydra.sweeper.{kind}={settings.name} takes {', '.join(own) if own else 'no arguments'}"
            )
        else:
            errors += [e for e in [_rule_error(where, value, rule)] if e]
    if isinstance(settings, SamplerSettings) and settings.group and not settings.multivariate:
        errors.append(
            "hydra.sweeper.sampler.group=true needs hydra.sweeper.sampler.multivariate=true "
            "(TPE groups parameters only when it models them jointly)"
        )
    return errors


def pruner_of(value: Any, min_trials: Any) -> PrunerSettings:
    """`hydra.sweeper.pruner` (a name or PrunerSettings) with what clorch chooses for it: the
    median pruner's n_startup_trials is `min_trials` unless given."""
    pruner = value if isinstance(value, PrunerSettings) else PrunerSettings(name=value)
    if pruner.name == "median" and pruner.n_startup_trials is None:
        pruner = dataclasses.replace(pruner, n_startup_trials=min_trials)
    return pruner


def _pruner_error(value: Any) -> str | None:
    if isinstance(value, PrunerSettings):
        return None if value.name in PRUNERS else f"hydra.sweeper.pruner.name={value.name} {_allowed(PRUNERS)}"
    if isinstance(value, str):
        return None if value in PRUNERS else f"hydra.sweeper.pruner={value} {_allowed(PRUNERS)}"
    return (
        f"hydra.sweeper.pruner must be a name ({', '.join(PRUNERS)}) or a mapping of its name and arguments, "
        f"e.g. {{name: median, n_warmup_steps: 10}}, got {value!r}"
    )


def _allowed(names: tuple[str, ...]) -> str:
    return f"is not allowed; choose one of: {', '.join(names)}"


def choice_errors(sampler: SamplerSettings, pruner: Any, repeats: bool) -> list[str]:
    """Every error in the pruner's name and in the sampler's and pruner's arguments, once their
    names are known (the sampler's name is checked with the sweeper's keys). `repeats`: the
    sweep is repeatable (hydra.sweeper.repeatable), which TPE's constant liar would undo."""
    pruner_error = _pruner_error(pruner)
    errors = [pruner_error] if pruner_error else []
    if sampler.name in SAMPLERS:
        errors += argument_errors("sampler", sampler)
    if isinstance(pruner, PrunerSettings) and pruner_error is None:
        errors += argument_errors("pruner", pruner)
    if sampler.constant_liar and repeats:
        errors.append(
            "hydra.sweeper.sampler.constant_liar=true counts running trials as bad ones, but a repeatable sweep "
            "asks each trial where none is running (hydra.sweeper.repeatable, true when sampler.seed is given): "
            "leave constant_liar out, or set hydra.sweeper.repeatable=false"
        )
    return errors
