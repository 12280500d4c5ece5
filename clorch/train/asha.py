"""ASHA's rule (asynchronous successive halving, Li et al. 2020), read alike by a trial's rank 0
and by the sweep that promotes trials (`hydra.sweeper.pruner=asha`, clorch.sweep.study).

Rungs are steps: min_resource, min_resource * rf, min_resource * rf^2, ... below the trial's
last step (rf: reduction_factor), and the last step itself. A trial reports its objective
at every eval (Optuna's intermediate values); its value at a rung's step is its result at
that rung. Reaching a rung, a trial goes on when it is among the best 1/rf of the rung's
results so far (itself included), and is paused otherwise: it writes a checkpoint at the
rung and ends (status paused). Whenever the sweep has room for a trial, it first promotes
a paused trial that is now among the best 1/rf of its rung (from the highest rung first,
the best first), which continues from its checkpoint bit for bit as if it had never paused.
When the sweep has nothing else to run (its n_trials asked, none running) and no trial has
reached its last step, the best paused trial of the highest rung is promoted
(`closing_promotion`), so that the sweep ends with a trained best trial.

What happened to a trial lives in the study, in one user attribute written at once:

    clorch_asha   {"paused_at": the rung step it is paused at, or null,
                   "promoted": the rung steps it went on from, by its own rank or by promotion}

so a sweep stopped at any moment and continued makes the same decisions. Optuna is not
imported: `trials` are Optuna's FrozenTrials, or anything with number, state's name,
intermediate_values and user_attrs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

ATTR = "clorch_asha"  # the trial's user attribute (see the module's docstring)
DEFAULT_REDUCTION_FACTOR = 3
DEFAULT_RUNGS = 2  # min_resource's default: the last step / rf^2 (two rungs below the last step)


def default_min_resource(total: int, reduction_factor: int, eval_every: int) -> int:
    """The first rung's step when `min_resource` is not given: total / rf^2, down to a multiple of
    `eval_every` (a trial reports at its evals only), and at least one eval."""
    every = max(1, eval_every)
    return max(every, total // reduction_factor**DEFAULT_RUNGS // every * every)


def ladder(min_resource: int | None, reduction_factor: int | None, total: int, eval_every: int) -> list[int]:
    """The rung steps below `total` (the last step, the final rung, is not among them)."""
    factor = reduction_factor or DEFAULT_REDUCTION_FACTOR
    step = min_resource or default_min_resource(total, factor, eval_every)
    steps = []
    while step < total:
        steps.append(step)
        step *= factor
    return steps


@dataclass(frozen=True)
class Mark:
    """A trial's ASHA record (the `clorch_asha` user attribute)."""

    paused_at: int | None = None
    promoted: tuple[int, ...] = ()

    @classmethod
    def of(cls, user_attrs: dict[str, Any]) -> "Mark":
        record = user_attrs.get(ATTR) or {}
        return cls(record.get("paused_at"), tuple(record.get("promoted") or ()))

    @property
    def paused(self) -> bool:
        """Paused at a rung and not promoted from it since."""
        return self.paused_at is not None and self.paused_at not in self.promoted

    def pause(self, step: int) -> dict[str, Any]:
        """The attribute's value once paused at `step`."""
        return {"paused_at": step, "promoted": list(self.promoted)}

    def go_on(self, step: int) -> dict[str, Any]:
        """The attribute's value once gone on from rung `step` (promoted, or among the best at once)."""
        return {"paused_at": None, "promoted": sorted({*self.promoted, step})}


def _state(trial: Any) -> str:
    return getattr(trial.state, "name", str(trial.state))


def best_at(trials: Iterable[Any], step: int, reduction_factor: int, maximize: bool) -> list[int]:
    """The numbers of the best 1/rf (rounded down) of the trials with a result at rung `step`,
    best first (ties: the lower number first)."""
    sign = -1.0 if maximize else 1.0
    results = sorted(
        (sign * float(t.intermediate_values[step]), t.number) for t in trials if step in t.intermediate_values
    )
    return [number for _, number in results[: len(results) // reduction_factor]]


def goes_on(trials: list[Any], number: int, step: int, reduction_factor: int, maximize: bool) -> bool:
    """Whether trial `number`, at rung `step` with its result reported, goes on (else it pauses)."""
    mine = next(t for t in trials if t.number == number)
    if step in Mark.of(mine.user_attrs).promoted:  # promoted from here before (a resumed trial)
        return True
    return number in best_at(trials, step, reduction_factor, maximize)


def promotion(trials: list[Any], reduction_factor: int, maximize: bool) -> tuple[Any, int] | None:
    """(the paused trial to promote, its rung step) by ASHA's rule, or None: none is among the
    best 1/rf of its rung. The highest rung first; within it, the best result."""
    paused = {t.number: t for t in trials if _state(t) == "RUNNING" and Mark.of(t.user_attrs).paused}
    for step in sorted({Mark.of(t.user_attrs).paused_at for t in paused.values()}, reverse=True):
        for number in best_at(trials, step, reduction_factor, maximize):
            if number in paused and Mark.of(paused[number].user_attrs).paused_at == step:
                return paused[number], step
    return None


def closing_promotion(trials: list[Any], maximize: bool) -> tuple[Any, int] | None:
    """(the paused trial to promote, its rung step) when a sweep has nothing else to run and no trial
    has finished: the best of the highest rung's paused trials, so that the sweep ends with one
    trained to its last step (ASHA's rule alone needs rf results at a rung to promote one)."""
    if any(_state(t) == "COMPLETE" for t in trials):
        return None
    paused = [t for t in trials if is_paused(t)]
    if not paused:
        return None
    step = max(Mark.of(t.user_attrs).paused_at for t in paused)
    sign = -1.0 if maximize else 1.0
    at_step = [t for t in paused if Mark.of(t.user_attrs).paused_at == step]
    return min(at_step, key=lambda t: (sign * float(t.intermediate_values[step]), t.number)), step


def is_paused(trial: Any) -> bool:
    """A RUNNING trial that ASHA paused (no sweep runs it; it is no cut-off trial)."""
    return _state(trial) == "RUNNING" and Mark.of(trial.user_attrs).paused
