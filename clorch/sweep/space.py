"""A search space in Hydra's sweep grammar, read into Optuna's distributions.

The grammar is Hydra's (the one its Optuna sweeper plugin reads), on the command
line or in a search-space file:

    optim.lr='tag(log, interval(1e-4, 1e-1))'   a float (or int) range, log-uniform with `log`
    optim.lr='interval(1e-4, 1e-1)'             uniform
    batch_size='range(16, 65, 16)'              16, 32, 48, 64 (Hydra's range: the end excluded)
    optim=choice(adamw, sgd)                    categorical
    optim.lr=1e-3,3e-4                          categorical, the plain form

A value that is not a sweep (`batch_size=32`) is a fixed override of every trial.
Each parameter's representative values (its bounds, every choice) are what the
config checks run on before the first trial: a value of the wrong type for its
key is a config error then, not a failed trial.
Imports neither torch nor Optuna: `Param.distribution` imports Optuna when a sweep runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep

from clorch.config.composer import format_value


@dataclass(frozen=True)
class Param:
    """One searched key: a categorical list, or a numeric interval (`low`..`high`, both included)."""

    key: str  # the override's key as typed, without +/++ (`optim.lr`, or a group: `optim`)
    kind: str  # "choice", "float" or "int"
    choices: tuple[Any, ...] = ()  # kind "choice": the values, as Hydra parsed them
    low: float | int | None = None
    high: float | int | None = None
    step: float | int | None = None  # a range's step (ints and floats); None: continuous
    log: bool = False
    prefix: str = ""  # "+" or "++" as typed: kept on each trial's override

    def override(self, value: Any) -> str:
        """The trial's command-line override for `value` (Hydra's grammar, quoted where needed)."""
        return f"{self.prefix}{self.key}={format_value(value)}"

    def representatives(self) -> list[Any]:
        """The values the config checks run on before the sweep: every choice, or both bounds."""
        if self.kind == "choice":
            return list(self.choices)
        return [self.low, self.high]

    def distribution(self) -> Any:
        """Optuna's distribution for this parameter."""
        import optuna.distributions as d  # lazy: a sweep only; the command line starts without it

        if self.kind == "choice":
            return d.CategoricalDistribution([_encode(c) for c in self.choices])
        if self.kind == "int":
            return d.IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return d.FloatDistribution(float(self.low), float(self.high), log=self.log, step=self.step)

    def decode(self, value: Any) -> Any:
        """A value Optuna suggested, back as this parameter's value (choices are stored as strings
        where Optuna could not store them as they are)."""
        if self.kind != "choice":
            return value
        for choice in self.choices:
            if _encode(choice) == value:
                return choice
        return value


def _encode(value: Any) -> Any:
    """Optuna's categorical values are None, bool, int, float or str: others by their literal."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else format_value(value)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _interval(override: Override, key: str) -> Param:
    sweep: IntervalSweep = override.value()
    low, high, log = sweep.start, sweep.end, "log" in sweep.tags
    if not (_number(low) and _number(high)):
        raise ValueError(f"{key}: interval({low}, {high}) needs two numbers")
    if not low < high:
        raise ValueError(f"{key}: interval({low}, {high}) must have its lower bound first (got {low} >= {high})")
    if log and low <= 0:
        raise ValueError(f"{key}: tag(log, interval({low}, {high})) needs a lower bound > 0 (a log scale)")
    kind = "int" if isinstance(low, int) and isinstance(high, int) else "float"
    return Param(key, kind, low=low, high=high, log=log)


def _range(override: Override, key: str) -> Param:
    sweep: RangeSweep = override.value()
    values = list(override.sweep_iterator())
    if not values:
        raise ValueError(f"{key}: range({sweep.start}, {sweep.stop}, {sweep.step}) holds no value")
    if sweep.shuffle or len(values) == 1:
        return Param(key, "choice", choices=tuple(values))
    if sweep.step <= 0:  # a descending range: the same values, as a choice
        return Param(key, "choice", choices=tuple(values))
    kind = "float" if any(isinstance(v, float) for v in (sweep.start, sweep.stop, sweep.step)) else "int"
    # Hydra's range excludes its end; Optuna's step distributions include theirs: the last value.
    return Param(key, kind, low=values[0], high=values[-1], step=sweep.step)


def parse_param(override: Override) -> Param | None:
    """The searched parameter of one parsed override, or None when it is a fixed value.

    Raises:
        ValueError: a bound in the wrong order, a log interval that reaches 0, an empty range,
            or a sweep form that cannot be searched (a `glob`).
    """
    if not override.is_sweep_override():
        return None
    key = override.key_or_group
    prefix = {"ADD": "+", "FORCE_ADD": "++"}.get(override.type.name, "")
    if override.is_interval_sweep():
        param = _interval(override, key)
    elif override.is_range_sweep():
        param = _range(override, key)
    elif override.is_choice_sweep() and isinstance(override.value(), ChoiceSweep):
        choices = tuple(override.sweep_iterator())
        if len(set(map(format_value, choices))) != len(choices):
            raise ValueError(f"{key}: choice({', '.join(map(format_value, choices))}) names a value twice")
        param = Param(key, "choice", choices=choices)
    else:
        raise ValueError(f"{override.input_line}: a glob cannot be searched; list the options with choice(...)")
    if param.kind == "float" and param.step is not None and not math.isfinite(param.step):
        raise ValueError(f"{key}: a range's step must be finite")
    return Param(**{**param.__dict__, "prefix": prefix})


@dataclass
class SearchSpace:
    """The overrides of a sweep, split: the searched parameters and the fixed overrides."""

    params: list[Param]
    fixed: list[str]

    def trial_overrides(self, values: dict[str, Any]) -> list[str]:
        """The command-line overrides of one trial: the fixed ones, then each parameter's value."""
        return [*self.fixed, *(p.override(values[p.key]) for p in self.params)]

    def representative_overrides(self) -> list[list[str]]:
        """Override lists the checks run on: every parameter at its first value, then each
        parameter at each of its other values with the rest at their first."""
        first = {p.key: p.representatives()[0] for p in self.params}
        lists = [self.trial_overrides(first)]
        for p in self.params:
            for value in p.representatives()[1:]:
                lists.append(self.trial_overrides({**first, p.key: value}))
        return lists


def parse_space(overrides: list[str], params: dict[str, str] | None = None) -> tuple[SearchSpace | None, list[str]]:
    """(the search space, every error) of a sweep's command-line overrides and its `params`
    ({key: grammar}, a search-space file's or `hydra.sweeper.params`'s; the command line wins).

    Hydra's own keys (hydra.*, hydra/...) are left out of both.
    """
    lines = [f"{k}={v}" for k, v in (params or {}).items()]
    given = {o.partition("=")[0].lstrip("+~") for o in overrides}
    lines = [line for line in lines if line.partition("=")[0] not in given] + list(overrides)
    errors: list[str] = []
    found: list[Param] = []
    fixed: list[str] = []
    for line in lines:
        key = line.partition("=")[0].lstrip("+~")
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            continue
        try:
            (override,) = OverridesParser.create().parse_overrides([line])
            param = parse_param(override)
        except ValueError as exc:
            errors.append(str(exc))
            continue
        except Exception as exc:  # Hydra's grammar error
            errors.append(f"{line}: {str(exc).strip().splitlines()[0]}")
            continue
        if param is None:
            fixed.append(line)
        else:
            found.append(param)
    if errors:
        return None, errors
    return SearchSpace(found, fixed), []
