"""`clorch-runs plot`: several runs' curves of one metric on one picture, labelled by what differs.

matplotlib comes with the `plot` extra (`pip install 'clorch[plot]'`); it is
imported only here, when a picture is drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from clorch.runs.discover import UsageError
from clorch.runs.query import flatten
from clorch.runs.records import Run

MAX_LABEL_KEYS = 3  # more differing keys than this make a legend nobody reads


class MissingExtra(RuntimeError):
    """An optional dependency is not installed; the message says which extra brings it."""


def series(run: Run, metric: str) -> list[tuple[float, float]]:
    """(step, value) of every metrics.jsonl record of the run that has `metric`."""
    points = []
    for record in run.metrics:
        step, value = record.get("step"), record.get(metric)
        if _number(step) and _number(value):
            points.append((step, value))
    return points


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# Keys that say where a run kept or found its checkpoints, not what it trained: a sweep's
# continued trial (checkpoint.resume=latest) trains what its first start would have.
NOT_TRAINING = ("checkpoint.resume", "checkpoint.dir", "checkpoint.path")


def differing(runs: Sequence[Run]) -> list[str]:
    """The config keys whose values differ between `runs` (where they keep checkpoints aside):
    those given as overrides first."""
    configs = [{k: v for k, v in flatten(r.config).items() if k not in NOT_TRAINING} for r in runs]
    keys: dict[str, None] = {}
    for config in configs:
        keys.update(dict.fromkeys(config))
    differ = [k for k in keys if len({repr(c.get(k)) for c in configs}) > 1]
    given = {o.partition("=")[0] for r in runs for o in r.overrides}
    return sorted(differ, key=lambda k: (k not in given, list(keys).index(k)))


def labels(runs: Sequence[Run]) -> list[str]:
    """One legend entry a run: `key=value` for the keys that differ (the recipe too), else its id."""
    keys = differing(runs)[:MAX_LABEL_KEYS]
    recipes = {r.recipe for r in runs}
    out = []
    for run in runs:
        config = flatten(run.config)
        parts = [f"recipe={run.recipe}"] if len(recipes) > 1 else []
        parts += [f"{k}={config.get(k)}" for k in keys]
        out.append(" ".join(parts) or f"{run.id} ({run.path.name})")
    if len(set(out)) < len(out):  # the same config twice: the ids tell them apart
        out = [f"{label} [{run.id}]" for label, run in zip(out, runs)]
    return out


def check_out(out: Path, runs: Sequence[Run]) -> Path:
    """`out`, made absolute; never inside a run directory, and its folder must exist."""
    out = out.expanduser().resolve()
    for run in runs:
        if out.is_relative_to(run.path):
            raise UsageError(
                f"--out {str(out)!r} lies in the run directory {run.path}; clorch-runs never "
                "writes into run directories: choose a path outside it"
            )
    if not out.parent.is_dir():
        raise UsageError(f"--out {str(out)!r}: the folder {out.parent} does not exist")
    return out


def plot(runs: Sequence[Run], metric: str, out: Path) -> tuple[Path, list[Run]]:
    """Draw `metric` against step for `runs` into the PNG `out`.

    Returns:
        (the picture's path, the runs that have no value of `metric` and are left out).

    Raises:
        UsageError: no run has `metric` (the message lists the metrics they have), or a bad `out`.
        MissingExtra: matplotlib is not installed.
    """
    out = check_out(out, runs)
    curves = [(run, series(run, metric)) for run in runs]
    if not any(points for _, points in curves):
        have = sorted(
            {k for run in runs for r in run.metrics for k, v in r.items() if _number(v) and k not in ("step", "epoch")}
        )
        raise UsageError(
            f"--metric {metric!r}: none of the runs recorded it in metrics.jsonl; "
            f"allowed: {', '.join(have) or '(no metrics recorded yet)'}"
        )
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingExtra("clorch-runs plot needs matplotlib: pip install 'clorch[plot]'") from None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (run, points), label in zip(curves, labels(runs)):
        if points:
            steps, values = zip(*points)
            ax.plot(steps, values, "o-" if len(points) < 20 else "-", label=label, markersize=3)
    values = [v for _, points in curves for _, v in points]
    if "loss" in metric and min(values) > 0 and max(values) > 10 * min(values):
        ax.set_yscale("log")  # losses that fall by orders of magnitude
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out, [run for run, points in curves if not points]
