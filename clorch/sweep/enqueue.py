"""Known-good trials first: `hydra.sweeper.enqueue`, a list of {key: value} mappings of searched keys.

    hydra.sweeper.enqueue='[{optim.lr: 1e-3, optim: adamw}, {optim.lr: 3e-4}]'   on the command line
    enqueue: [{optim.lr: 1.0e-3, optim: adamw}]                                   in a search-space file

The study asks them first, in order, as Optuna's `enqueue_trial` does: trial k of the
study is the k-th mapping (clorch.sweep.study). A key an entry leaves out is sampled as
in any trial. They are the study's first trials, so a continued sweep, whose study holds
them already, never asks them again.

Before the first trial each entry is checked against the search space (a searched key,
a value among its choices or inside its interval, on its range's step) and its config is
checked as any trial's (clorch.sweep.checks.sweep_errors). A value written as text (YAML
reads `1e-3` as text) is read with Hydra's grammar, as the command line reads it.
Imports neither torch nor Optuna.
"""

from __future__ import annotations

import math
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser

from clorch.sweep.space import Param, SearchSpace

FORM = "'hydra.sweeper.enqueue=[{optim.lr: 1e-3}]'"  # the command line's form, quoted for the shell


def _typed(key: str, value: Any) -> Any:
    """A text value as Hydra's grammar reads it on the command line (`1e-3` a float, `sgd` text)."""
    if not isinstance(value, str):
        return value
    try:
        (override,) = OverridesParser.create().parse_overrides([f"{key}={value}"])
        return override.value()
    except Exception:  # not Hydra's grammar: the text, checked as it is
        return value


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _value_error(where: str, param: Param, value: Any) -> str | None:
    """Why `value` is not one of `param`'s values (None: it is)."""
    if param.kind == "choice":
        if any(value == c and (type(value) is type(c) or _number(value) and _number(c)) for c in param.choices):
            return None
        return f"{where}={value!r} is not one of its choices: {', '.join(map(str, param.choices))}"
    span = f"[{param.low}, {param.high}]"
    if not _number(value) or not math.isfinite(value) or (param.kind == "int" and not float(value).is_integer()):
        kind = "an integer" if param.kind == "int" else "a number"
        return f"{where} must be {kind} in {span}, got {value!r}"
    if not param.low <= value <= param.high:
        return f"{where}={value} is outside its {'range' if param.step else 'interval'} {span}"
    if param.step is not None:
        steps = (value - param.low) / param.step
        if not math.isclose(steps, round(steps), abs_tol=1e-9):
            return f"{where}={value} is not on its range's step: {param.low}, {param.low + param.step}, ... {span}"
    return None


def read_enqueue(
    enqueue: Any, space: SearchSpace, n_trials: int, where: str = "hydra.sweeper.enqueue"
) -> tuple[list[dict[str, Any]], list[str]]:
    """(the enqueued trials as {key: value}, every error in them), checked against `space`."""
    if enqueue is None:
        return [], []
    if not isinstance(enqueue, list):
        return [], [f"{where} must be a list of {{key: value}} mappings of searched keys, e.g. {FORM}, got {enqueue!r}"]
    params = {p.key: p for p in space.params}
    trials, errors = [], []
    for index, entry in enumerate(enqueue):
        if not isinstance(entry, dict) or not entry:
            errors.append(f"{where}[{index}] must be a {{key: value}} mapping of searched keys, got {entry!r}")
            continue
        trial = {}
        for key, value in entry.items():
            key = str(key)
            if key not in params:
                errors.append(
                    f"{where}[{index}].{key} is not a searched key; an enqueued trial sets searched keys: "
                    f"{', '.join(params)}"
                )
                continue
            trial[key] = _typed(key, value)
            error = _value_error(f"{where}[{index}].{key}", params[key], trial[key])
            errors += [error] if error else []
        trials.append(trial)
    if isinstance(n_trials, int) and len(enqueue) > n_trials:
        errors.append(f"{where} holds {len(enqueue)} trials, more than hydra.sweeper.n_trials={n_trials}")
    return trials, errors


def enqueued_overrides(space: SearchSpace, trials: list[dict[str, Any]]) -> list[list[str]]:
    """Each enqueued trial's overrides as the checks run them: a key it leaves out at its first value."""
    first = {p.key: p.representatives()[0] for p in space.params}
    return [space.trial_overrides({**first, **trial}) for trial in trials]


def optuna_params(space: SearchSpace, trial: dict[str, Any]) -> dict[str, Any]:
    """An enqueued trial's values as Optuna's enqueue_trial takes them (choices as the study stores them)."""
    params = {p.key: p for p in space.params}
    return {key: params[key].encode(value) for key, value in trial.items()}
