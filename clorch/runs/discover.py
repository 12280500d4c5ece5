"""Finding run directories under roots (outputs/ and multirun/ by default), and naming one.

A run directory is one holding any of `records.MARKERS`; the walk does not go
into a run directory, nor into symbolic links (a resumed run's link to its
predecessor would list that run twice), hidden folders, logs/, checkpoints/, or
the trackers' stores (mlartifacts/, mlruns/, wandb/: their copies of a run's
files are not runs; MLflow's mlflow.db is a file, never a run).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Sequence

from clorch.runs.records import Run, is_run_dir, is_sweep_dir
from clorch.trackers import tracker_folders

DEFAULT_ROOTS = ("outputs", "multirun")
# The trackers' stores hold copies of a run's files (config.yaml, summary.json): MLflow's
# mlartifacts/ (beside the default mlflow.db) and mlruns/ (a file store), W&B's wandb/, and
# whatever folders another tracker declares (clorch.trackers.tracker_folders).
_SKIPPED = {"logs", "checkpoints", *tracker_folders()}


class UsageError(ValueError):
    """A bad argument on the command line: the message names it, the value and what is allowed."""


def default_roots(cwd: str | os.PathLike | None = None) -> list[Path]:
    """outputs/ and multirun/ under `cwd` (default: the current directory), those that exist."""
    base = Path(cwd or os.getcwd())
    return [base / name for name in DEFAULT_ROOTS if (base / name).is_dir()]


def check_roots(roots: Sequence[str | os.PathLike]) -> list[Path]:
    """The roots as paths; raises UsageError naming a --root that is not a directory."""
    out = []
    for root in roots:
        path = Path(root).expanduser()
        if not path.is_dir():
            raise UsageError(
                f"--root {str(root)!r}: not a directory (give a folder holding run "
                "directories, such as outputs/ or multirun/)"
            )
        out.append(path)
    return out


def find_runs(roots: Iterable[str | os.PathLike]) -> list[Run]:
    """Every run directory under `roots` (each once), ordered by start time, then directory."""
    found: dict[Path, Run] = {}
    for root in roots:
        root = Path(root).resolve()
        if is_run_dir(root):
            found.setdefault(root, Run(root))
            continue
        for directory, subdirs, _ in os.walk(root, followlinks=False):
            here = Path(directory)
            keep = []
            for name in sorted(subdirs):
                path = here / name
                if name.startswith(".") or name in _SKIPPED or path.is_symlink():
                    continue
                if is_run_dir(path):
                    found.setdefault(path, Run(path))
                else:
                    keep.append(name)
            subdirs[:] = keep
    return sorted(found.values(), key=_order)


def _order(run: Run) -> tuple:
    # A sweep's trials stay together, in job order, at the sweep's start time.
    sweep = run.sweep
    start = run.start
    anchor = str(sweep) if sweep else str(run.path)
    return (start is None, start.isoformat() if start else "", anchor, _trial_number(run))


def _trial_number(run: Run) -> int:
    return int(run.path.name) if run.sweep and run.path.name.isdigit() else -1


def select(name: str, runs: Sequence[Run], roots: Sequence[Path]) -> Run:
    """The run `name` names: a run directory's path, a run id (or a unique prefix of one, 4+
    characters), or the end of a run directory's path (`06-13-41`, `2026-12-02/06-13-55/1`).

    Raises:
        UsageError: nothing matches, several runs do, or `name` is a sweep directory.
    """
    path = Path(name).expanduser()
    if path.is_dir():
        if is_run_dir(path):
            return Run(path)
        if is_sweep_dir(path):
            trials = sorted(p.name for p in path.iterdir() if p.name.isdigit() and is_run_dir(p))
            raise UsageError(
                f"RUN {name!r} is a sweep directory; name one of its trials: "
                + ", ".join(str(path / t) for t in trials)
            )
    exact = [r for r in runs if r.id == name]
    matches = exact or [r for r in runs if len(name) >= 4 and r.id.startswith(name)]
    if not matches:
        parts = Path(name).parts
        matches = [r for r in runs if parts and r.path.parts[-len(parts) :] == parts]
    if len(matches) == 1:
        return matches[0]
    where = ", ".join(str(r) for r in roots) or "(no outputs/ or multirun/ here)"
    if not matches:
        raise UsageError(
            f"RUN {name!r}: no run has that directory or id under {where}; allowed: a run "
            "directory, a run id or its first 4+ characters, or the end of a run's path "
            "(`clorch-runs ls` lists them; --root DIR looks elsewhere)"
        )
    listed = "; ".join(f"{r.id} {r.path}" for r in matches[:10])
    raise UsageError(f"RUN {name!r} matches {len(matches)} runs ({listed}); give more of the id or path")
