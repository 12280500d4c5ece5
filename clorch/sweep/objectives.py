"""One objective or several: `hydra.sweeper.objective` and `direction`, checked, and the Pareto front.

    hydra.sweeper.objective=eval_loss                                         one, minimized (the default)
    hydra.sweeper.objective=[eval_loss,loss] hydra.sweeper.direction=[minimize,minimize]   several

With several objectives the study is Optuna's multi-objective study (`directions`): each
trial is told the value of each, and no trial is best alone: the sweep names its Pareto
front, the trials that no other trial beats on every objective (Optuna's `study.best_trials`).
Optuna cannot prune such a study, and its CMA-ES sampler searches one objective: both are
refused before the first trial. Imports neither torch nor Optuna.
"""

from __future__ import annotations

from typing import Any, Sequence

DIRECTIONS = ("minimize", "maximize")
METRIC_HINT = "a metric of the trials' final metrics (loss, eval_loss, ...), or a list of them, [eval_loss,loss]"


def as_list(value: Any) -> list[Any]:
    """A key that takes one value or a list of them, as a list."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


def objective_errors(objective: Any, direction: Any, pruner: str, sampler: str) -> list[str]:
    """Every error in `hydra.sweeper.objective` and `direction`, and in what several objectives exclude."""
    names, directions = as_list(objective), as_list(direction)
    errors = []
    if names == [] or (objective is not None and not all(isinstance(n, str) and n for n in names)):
        errors.append(f"hydra.sweeper.objective must name {METRIC_HINT}, got {objective!r}")
    elif len(set(names)) < len(names):
        errors.append(f"hydra.sweeper.objective names a metric twice: {', '.join(map(str, names))}")
    for value in directions:
        if value not in DIRECTIONS:
            errors.append(f"hydra.sweeper.direction={value} is not allowed; choose one of: {', '.join(DIRECTIONS)}")
    if errors:
        return errors
    if len(directions) != len(names):
        errors.append(
            f"hydra.sweeper.direction gives {len(directions)} direction(s) for {len(names)} objective(s) "
            f"({', '.join(n or 'the default' for n in names)}): give one each, e.g. "
            f"direction=[{','.join(['minimize'] * len(names))}]"
        )
    if len(names) > 1 and pruner != "none":
        errors.append(
            f"hydra.sweeper.pruner={pruner} cannot prune a sweep of several objectives (hydra.sweeper.objective="
            f"[{','.join(names)}]): Optuna prunes single-objective studies only; set hydra.sweeper.pruner=none"
        )
    if len(names) > 1 and sampler == "cmaes":
        errors.append(
            f"hydra.sweeper.sampler=cmaes searches one objective, and hydra.sweeper.objective names {len(names)}: "
            "choose tpe, random, grid or qmc"
        )
    return errors


def dominates(a: Sequence[float], b: Sequence[float], directions: Sequence[str]) -> bool:
    """Whether values `a` are at least as good as `b` on every objective and better on one."""
    signs = [1 if d == "minimize" else -1 for d in directions]
    at_least = all(s * x <= s * y for s, x, y in zip(signs, a, b, strict=True))
    return at_least and any(s * x < s * y for s, x, y in zip(signs, a, b, strict=True))


def pareto_front(points: Sequence[Sequence[float]], directions: Sequence[str]) -> list[int]:
    """The indices of `points` that no other point dominates, in order (Optuna's best_trials)."""
    return [i for i, p in enumerate(points) if not any(dominates(q, p, directions) for q in points)]
