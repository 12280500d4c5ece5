"""A search space in Hydra's sweep grammar, read into Optuna's distributions.

The grammar is Hydra's (the one its Optuna sweeper plugin reads), on the command
line or in a search-space file:

    optim.lr='tag(log, interval(1e-4, 1e-1))'   a float (or int) range, log-uniform with `log`
    optim.lr='interval(1e-4, 1e-1)'             uniform
    warmup='int(interval(10, 500))'             an int, uniform (`int(...)` casts the bounds)
    batch_size='range(16, 65, 16)'              16, 32, 48, 64 (Hydra's range: the end excluded)
    optim=choice(adamw, sgd)                    categorical
    optim.lr=1e-3,3e-4                          categorical, the plain form

`log` is the one tag, and only an interval takes it. A value that is not a sweep
(`batch_size=32`) is a fixed override of every trial.

Before the first trial the config checks run on each parameter's representative
values (`Param.representatives`): a value of the wrong type for its key is a
config error then, not a failed trial. What is read stays bounded however large
the space: a range is counted, never listed (unless it is shuffled or descending,
and then it is a choice), a choice holds at most MAX_VALUES values, a space at
most MAX_PARAMS parameters, and a large choice is checked at a bounded set of
its values (`Param.representatives`).
Imports neither torch nor Optuna: `Param.distribution` imports Optuna when a sweep runs.
"""

from __future__ import annotations

import decimal
import math
from dataclasses import dataclass
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep

from clorch.config.composer import format_value

TAGS = ("log",)  # the tags an interval takes (Hydra's Optuna sweeper reads `log` and no other)
MAX_VALUES = 10_000  # values of one choice (or of a shuffled or descending range, which is listed)
MAX_PARAMS = 32  # searched parameters in one space
MAX_LINES = 256  # overrides and `params` entries of one space, counted before any is parsed
CHECK_EVERY_VALUE_UP_TO = 16  # a choice of more values is checked at a bounded set of them
MAX_CHECKED = 64  # configs checked before the first trial, unless each parameter is at its bounded set
MAX_GRID = 10_000  # combinations of a grid (hydra/sweeper=basic, or Optuna's grid sampler), listed at its start


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

    def representatives(self, up_to: int = CHECK_EVERY_VALUE_UP_TO) -> list[Any]:
        """The values the config checks run on before the sweep: both bounds of an interval or a
        range; every value of a choice of at most `up_to`; of a larger choice, its first and last
        value, its smallest and largest number and the first value of each other type (a string
        among numbers, a list, null), so that what is checked stays bounded."""
        if self.kind != "choice":
            return [self.low, self.high]
        if len(self.choices) <= up_to:
            return list(self.choices)
        numbers = [c for c in self.choices if _number(c)]
        picked = [self.choices[0], self.choices[-1], *([min(numbers), max(numbers)] if numbers else [])]
        kinds = {type(c) for c in picked}
        for choice in self.choices:
            if type(choice) not in kinds:
                picked.append(choice)
                kinds.add(type(choice))
        unique: dict[tuple[type, str], Any] = {}
        for choice in picked:  # by type too: 1, 1.0 and true are three values to check
            unique.setdefault((type(choice), format_value(choice)), choice)
        return list(unique.values())

    def size(self) -> int | None:
        """How many values the parameter takes (None: an interval, continuous)."""
        if self.kind == "choice":
            return len(self.choices)
        if self.step is None:
            return None
        return int(round((self.high - self.low) / self.step)) + 1

    def distribution(self) -> Any:
        """Optuna's distribution for this parameter."""
        import optuna.distributions as d  # lazy: a sweep only; the command line starts without it

        if self.kind == "choice":
            return d.CategoricalDistribution([_encode(c) for c in self.choices])
        if self.kind == "int":
            return d.IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return d.FloatDistribution(float(self.low), float(self.high), log=self.log, step=self.step)

    def encode(self, value: Any) -> Any:
        """This parameter's `value` as Optuna's distribution holds it (`decode` reads it back)."""
        if self.kind == "choice":
            return _encode(value)
        return int(value) if self.kind == "int" else float(value)

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


def _tag_error(key: str, sweep: Any, line: str) -> str | None:
    """An error for a tag the search would ignore: any tag but `log`, or a tag on a choice or range."""
    tags = sorted(getattr(sweep, "tags", None) or ())
    if isinstance(sweep, IntervalSweep):
        unknown = [t for t in tags if t not in TAGS]
        if unknown:
            return (
                f"{line}: tag {', '.join(unknown)} is not known; an interval takes the tag: {', '.join(TAGS)} "
                "(e.g. tag(log, interval(1e-4, 1e-1)))"
            )
    elif tags:
        return (
            f"{line}: tag {', '.join(tags)} applies to an interval only, and a choice or range takes no tag; "
            "write tag(log, interval(LOW, HIGH)), or tag(log, int(interval(LOW, HIGH))) for integers"
        )
    return None


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


def _is_float_range(sweep: RangeSweep) -> bool:
    """Whether Hydra lists this range as floats (any of its three numbers a float)."""
    return any(isinstance(v, float) for v in (sweep.start, sweep.stop, sweep.step))


def range_size(sweep: RangeSweep) -> int:
    """How many values Hydra's `range(start, stop, step)` holds, counted without listing them
    (Hydra steps a float range in decimal arithmetic, from `start` while short of `stop`)."""
    if not _is_float_range(sweep):
        return len(range(sweep.start, sweep.stop, sweep.step))
    start, stop, step = (decimal.Decimal(v) for v in (sweep.start, sweep.stop, sweep.step))
    return max(0, math.ceil((stop - start) / step))


def _nth(sweep: RangeSweep, n: int) -> int | float:
    """The range's value number `n` (from 0), as Hydra lists it."""
    if not _is_float_range(sweep):
        return sweep.start + n * sweep.step
    return float(decimal.Decimal(sweep.start) + n * decimal.Decimal(sweep.step))


def _range(override: Override, key: str) -> Param:
    sweep: RangeSweep = override.value()
    shown = f"range({sweep.start}, {sweep.stop}, {sweep.step})"
    if not (_number(sweep.start) and _number(sweep.stop) and _number(sweep.step)):
        raise ValueError(f"{key}: {shown} needs three numbers")
    if sweep.step == 0 or not all(math.isfinite(v) for v in (sweep.start, sweep.stop, sweep.step)):
        raise ValueError(f"{key}: {shown} needs finite numbers and a step other than 0")
    size = range_size(sweep)
    if not size:
        raise ValueError(f"{key}: {shown} holds no value")
    if sweep.shuffle or size == 1 or sweep.step < 0:  # listed, as a choice of the same values
        if size > MAX_VALUES:
            raise ValueError(
                f"{key}: {'shuffle(' + shown + ')' if sweep.shuffle else shown} holds {size:,} values, and a "
                f"shuffled or descending range is searched as a choice of at most {MAX_VALUES:,}: "
                "write it ascending, range(LOW, HIGH, STEP), which has no such limit"
            )
        return Param(key, "choice", choices=tuple(override.sweep_iterator()))
    kind = "float" if _is_float_range(sweep) else "int"
    # Hydra's range excludes its end; Optuna's step distributions include theirs: the last value.
    low = float(sweep.start) if kind == "float" else sweep.start
    return Param(key, kind, low=low, high=_nth(sweep, size - 1), step=sweep.step)


def _choice(override: Override, key: str) -> Param:
    sweep: ChoiceSweep = override.value()
    if len(sweep.list) > MAX_VALUES:
        raise ValueError(
            f"{key}: a choice of {len(sweep.list):,} values; a choice holds at most {MAX_VALUES:,}: "
            "search numbers with range(LOW, HIGH, STEP) or interval(LOW, HIGH)"
        )
    choices = tuple(override.sweep_iterator())
    if len({format_value(c) for c in choices}) != len(choices):
        raise ValueError(f"{key}: choice({', '.join(map(format_value, choices))}) names a value twice")
    return Param(key, "choice", choices=choices)


def parse_param(override: Override) -> Param | None:
    """The searched parameter of one parsed override, or None when it is a fixed value.

    Raises:
        ValueError: a bound in the wrong order, a log interval that reaches 0, an empty range,
            a tag other than an interval's `log`, more values than MAX_VALUES, or a sweep form
            that cannot be searched (a `glob`).
    """
    if not override.is_sweep_override():
        return None
    key = override.key_or_group
    prefix = {"ADD": "+", "FORCE_ADD": "++"}.get(override.type.name, "")
    tag_error = _tag_error(key, override.value(), override.input_line)
    if tag_error:
        raise ValueError(tag_error)
    if override.is_interval_sweep():
        param = _interval(override, key)
    elif override.is_range_sweep():
        param = _range(override, key)
    elif override.is_choice_sweep() and isinstance(override.value(), ChoiceSweep):
        param = _choice(override, key)
    else:
        raise ValueError(f"{override.input_line}: a glob cannot be searched; list the options with choice(...)")
    return Param(**{**param.__dict__, "prefix": prefix})


def sweep_size(override: Override) -> int | None:
    """How many values a sweep override lists (1 for a fixed value), counted without listing a
    range; None for an interval or a glob, which list no values of their own."""
    if not override.is_sweep_override():
        return 1
    if override.is_range_sweep():
        return range_size(override.value())
    value = override.value()
    return len(value.list) if isinstance(value, ChoiceSweep) else None


def param_key_error(key: str, where: str) -> str | None:
    """An error for a search space's key that names code or one of Hydra's own keys (with +, ++ or
    ~ too): a space is data about the job's config, never about what runs or where it goes."""
    bare = key.lstrip("+~")
    if "_target_" in bare.split("."):
        return f"{where}params.{key} is not allowed: a search space may not name code (_target_)"
    if bare.replace("/", ".").split(".")[0] == "hydra":
        return (
            f"{where}params.{key} is not allowed: a search space may not set Hydra's keys; "
            "give them on the command line"
        )
    return None


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
        parameter at each of its other representatives with the rest at their first.

        Each parameter's representatives are every value of a choice of up to
        CHECK_EVERY_VALUE_UP_TO; when that would make more than MAX_CHECKED lists, every
        choice of more than two values is checked at its bounded set instead (first, last,
        smallest and largest number, one of each type: `Param.representatives`).
        """
        values = {p.key: p.representatives() for p in self.params}
        if 1 + sum(len(v) - 1 for v in values.values()) > MAX_CHECKED:
            values = {p.key: p.representatives(up_to=2) for p in self.params}
        first = {key: v[0] for key, v in values.items()}
        lists = [self.trial_overrides(first)]
        for key, others in values.items():
            for value in others[1:]:
                lists.append(self.trial_overrides({**first, key: value}))
        return lists


def _lines(overrides: list[str], params: dict[str, str]) -> tuple[list[str], list[str]]:
    """(the override lines of a space, every error in its `params` keys): the command line wins
    over `params`; Hydra's own keys on the command line (hydra.*, hydra/...) are left out."""
    errors = [e for e in (param_key_error(k, "hydra.sweeper.") for k in params) if e]
    given = {o.partition("=")[0].lstrip("+~") for o in overrides}
    lines = [f"{k}={v}" for k, v in params.items() if k.lstrip("+~") not in given and not param_key_error(k, "")]
    for line in overrides:
        key = line.partition("=")[0].lstrip("+~")
        if not (key == "hydra" or key.startswith(("hydra.", "hydra/"))):
            lines.append(line)
    return lines, errors


def _parse_line(line: str, where: str | None) -> tuple[Param | None, str | None]:
    """(the parameter of one override line or None for a fixed value, its error); an error
    starts with `where` the line was written, if not on the command line."""
    try:
        return parse_param(OverridesParser.create().parse_overrides([line])[0]), None
    except ValueError as exc:
        return None, f"{where}: {exc}" if where else str(exc)
    except Exception as exc:  # Hydra's grammar error
        return None, f"{where + ': ' if where else ''}{line}: {str(exc).strip().splitlines()[0]}"


def parse_space(
    overrides: list[str], params: dict[str, str] | None = None, origin: dict[str, str] | None = None
) -> tuple[SearchSpace | None, list[str]]:
    """(the search space, every error) of a sweep's command-line overrides and its `params`
    ({key: grammar}, a search-space file's or `hydra.sweeper.params`'s; the command line wins).

    Hydra's own keys (hydra.*, hydra/...) on the command line are left out of both; in
    `params`, they and `_target_` are errors. More than MAX_LINES lines (refused before
    parsing) or MAX_PARAMS searched keys is an error. `origin` names where a `params` key
    was written (a search-space file): its errors start with that.
    """
    lines, errors = _lines(list(overrides), dict(params or {}))
    if len(lines) > MAX_LINES:  # each takes Hydra's parser a fraction of a millisecond or more
        return None, [
            f"the sweep has {len(lines)} overrides and search-space keys; at most {MAX_LINES} are read: "
            "put the fixed settings in a recipe (+recipe=FILE)"
        ]
    found: list[Param] = []
    fixed: list[str] = []
    written = {f"{k}={v}": (origin or {}).get(k) for k, v in (params or {}).items()}
    for line in lines:
        param, error = _parse_line(line, written.get(line))
        if error:
            errors.append(error)
        elif param is None:
            fixed.append(line)
        else:
            found.append(param)
    if len(found) > MAX_PARAMS:
        errors.append(
            f"the search space has {len(found)} searched keys ({', '.join(p.key for p in found[:3])}, ...); "
            f"a sweep searches at most {MAX_PARAMS}: fix the others with KEY=VALUE"
        )
    if errors:
        return None, errors
    return SearchSpace(found, fixed), []
