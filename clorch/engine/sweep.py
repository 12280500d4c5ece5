"""The sweep summary: one row per job of a `clorch-train -m` multirun.

Hydra runs each combination as its own job (each a multi-rank launch with a
fresh port) in `multirun/DATE/TIME/N/`; at the end `SweepSummaryCallback`
writes `sweep_summary.csv` and `sweep_summary.md` into the sweep directory:
one column per overridden key (the recipe included), then the job's status,
final metrics and throughput. A failed job is a
row with its status; the sweep goes on.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

METRICS = ("loss", "eval_loss", "eval_exact")
RESULTS = ("status", "steps", *METRICS, "samples_per_s", "tokens_per_s", "wall_time_s")


def _overrides(job_dir: Path) -> dict[str, str]:
    """{key: value} of the job's overrides, `+`/`++` dropped (`+recipe=x` gives recipe: x)."""
    path = job_dir / ".hydra" / "overrides.yaml"
    if not path.exists():
        return {}
    from omegaconf import OmegaConf

    out = {}
    for item in OmegaConf.load(path):
        key, _, value = str(item).lstrip("+~").partition("=")
        out[key] = value
    return out


def collect(sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per job directory (a numbered subdirectory) of `sweep_dir`: its overrides
    (under "overrides", a {key: value} dict) and its results."""
    rows = []
    jobs = sorted((p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    for job_dir in jobs:
        path = job_dir / "summary.json"
        summary = json.loads(path.read_text()) if path.exists() else {"status": "missing"}
        final = summary.get("final") or {}
        row = {"job": job_dir.name, "overrides": _overrides(job_dir), "status": summary.get("status"),
               "steps": summary.get("steps"), "samples_per_s": summary.get("samples_per_s"),
               "tokens_per_s": summary.get("tokens_per_s"), "wall_time_s": summary.get("wall_time_s")}
        row.update({m: final.get(m) for m in METRICS})
        rows.append(row)
    return rows


def override_columns(rows: list[dict[str, Any]]) -> list[str]:
    """Every key some job overrode, in the order first seen: one column each (recipe included)."""
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row["overrides"]))
    return list(keys)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def write_summary(sweep_dir: Path) -> tuple[Path, Path]:
    """Write sweep_summary.csv and sweep_summary.md; return their paths.

    Columns: job, one per overridden key (its value in that job; empty where the
    job did not set it), then the results.
    """
    rows = collect(sweep_dir)
    keys = override_columns(rows)
    columns = ["job", *keys, *RESULTS]
    flat = [{**{k: v for k, v in r.items() if k != "overrides"},
             **{k: r["overrides"].get(k) for k in keys}} for r in rows]
    csv_path, md_path = sweep_dir / "sweep_summary.csv", sweep_dir / "sweep_summary.md"
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(flat)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r[c]) for c in columns) + " |" for r in flat]
    md_path.write_text("\n".join(lines) + "\n")
    return csv_path, md_path


# The statuses of the last sweep's jobs, read by `clorch-train` for its exit status: with
# hydra/launcher=submitit_* the jobs run in other processes, which report only through their
# summary.json files.
last_statuses: list[str] = []


class SweepSummaryCallback(Callback):
    """Hydra callback (configured in conf/config.yaml): summarize the sweep when it ends."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if sweep_dir.is_dir():
            last_statuses[:] = [str(row["status"]) for row in collect(sweep_dir)]
            _, md_path = write_summary(sweep_dir)
            print(f"clorch-train: sweep summary in {md_path} (and .csv)")
            print(md_path.read_text())
