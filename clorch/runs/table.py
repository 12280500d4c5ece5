"""Rows of runs for people (an aligned table) and for scripts (JSON, CSV)."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any, Sequence

from clorch.runs.query import FIELDS
from clorch.runs.records import Run

# Final metrics given a column of their own when some listed run has them.
METRIC_COLUMNS = ("loss", "eval_loss", "eval_exact")


def shown_path(path: Path | str, cwd: str | os.PathLike | None = None) -> str:
    """`path` relative to the current directory when it lies below it, else absolute."""
    path, base = Path(path), Path(cwd or os.getcwd()).resolve()
    try:
        return str(path.relative_to(base))
    except ValueError:
        return str(path)


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return " ".join(map(cell, value))
    return str(value)


def _commit(run: Run) -> str:
    if run.commit:
        return run.commit[:8]
    return f"clorch:{run.clorch_commit[:8]}" if run.clorch_commit else ""


def _steps(run: Run) -> str:
    steps, planned = run.steps, run.planned_steps
    if steps is None:
        return ""
    return f"{steps}/{planned}" if planned is not None else str(steps)


def list_rows(runs: Sequence[Run], group_sweeps: bool = True) -> tuple[list[str], list[list[str]]]:
    """The header and the rows of `clorch-runs ls`'s table.

    With `group_sweeps`, each sweep gets a line of its own (status "sweep", the
    trial count) before its first trial.
    """
    metrics = [m for m in METRIC_COLUMNS if any(m in r.final for r in runs)]
    best = any("eval_loss" in r.best for r in runs)
    header = [
        "id",
        "dir",
        "start",
        "recipe",
        "overrides",
        "status",
        "steps",
        *metrics,
        *(["best_eval_loss"] if best else []),
        "wall_s",
        "world",
        "commit",
    ]
    rows, seen = [], set()
    for run in runs:
        sweep = run.sweep
        if group_sweeps and sweep is not None and sweep not in seen:
            seen.add(sweep)
            count = sum(1 for r in runs if r.sweep == sweep)
            row = dict.fromkeys(header, "")
            row.update(dir=shown_path(sweep), status="sweep", overrides=f"{count} trial(s)")
            rows.append([row[h] for h in header])
        start = run.start
        row = {
            "id": run.id,
            "dir": shown_path(run.path),
            "recipe": run.recipe or "",
            "start": start.strftime("%Y-%m-%d %H:%M:%S") if start else "",
            "overrides": " ".join(run.overrides),
            "status": run.status,
            "steps": _steps(run),
            "best_eval_loss": cell(run.best.get("eval_loss")),
            "wall_s": f"{run.wall_time_s:.1f}" if run.wall_time_s is not None else "",
            "world": cell(run.world_size),
            "commit": _commit(run),
        }
        row.update({m: cell(run.final.get(m)) for m in metrics})
        rows.append([row[h] for h in header])
    return header, rows


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell; numbers right-aligned."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]
    numeric = [all(_numeric(r[i]) for r in rows if r[i]) and any(r[i] for r in rows) for i in range(len(header))]
    lines = []
    for cells in [list(header), *rows]:
        padded = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric)]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def _numeric(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def to_json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=False, default=str)


def to_csv(runs: Sequence[Run]) -> str:
    """One line per run: its fields, then `final.*` and `best.*` for every metric some run has."""
    records = [r.record() for r in runs]
    final = _union(r["final"] for r in records)
    best = _union(r["best"] for r in records)
    after_commit = FIELDS.index("commit") + 1  # the queryable fields, and clorch's own commit
    fields = [*FIELDS[:after_commit], "clorch_commit", *FIELDS[after_commit:]]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*fields, *(f"final.{k}" for k in final), *(f"best.{k}" for k in best)])
    for r in records:
        writer.writerow(
            [_csv_cell(r[f]) for f in fields]
            + [_csv_cell(r["final"].get(k)) for k in final]
            + [_csv_cell(r["best"].get(k)) for k in best]
        )
    return out.getvalue()


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    return " ".join(map(str, value)) if isinstance(value, list) else value


def _union(dicts: Any) -> list[str]:
    keys: dict[str, None] = {}
    for d in dicts:
        keys.update(dict.fromkeys(d))
    return list(keys)
