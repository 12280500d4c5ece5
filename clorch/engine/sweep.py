"""The sweep summary: one row per job of a `clorch-train -m` multirun.

Hydra runs each combination as its own job (each a multi-rank launch with a
fresh port) in `multirun/DATE/TIME/N/`; at the end `SweepSummaryCallback`
writes `sweep_summary.csv` and `sweep_summary.md` into the sweep directory:
the job's overrides, status, final metrics and throughput. A failed job is a
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
COLUMNS = ("job", "overrides", "status", "steps", *METRICS, "samples_per_s", "tokens_per_s",
           "wall_time_s")


def _overrides(job_dir: Path) -> str:
    path = job_dir / ".hydra" / "overrides.yaml"
    if not path.exists():
        return ""
    from omegaconf import OmegaConf

    items = [str(o).lstrip("+") for o in OmegaConf.load(path)]
    return " ".join(o for o in items if not o.startswith("recipe="))


def collect(sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per job directory (a numbered subdirectory) of `sweep_dir`."""
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


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def write_summary(sweep_dir: Path) -> tuple[Path, Path]:
    """Write sweep_summary.csv and sweep_summary.md; return their paths."""
    rows = collect(sweep_dir)
    csv_path, md_path = sweep_dir / "sweep_summary.csv", sweep_dir / "sweep_summary.md"
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cell(r[c]) for c in COLUMNS) + " |" for r in rows]
    md_path.write_text("\n".join(lines) + "\n")
    return csv_path, md_path


class SweepSummaryCallback(Callback):
    """Hydra callback (configured in conf/config.yaml): summarize the sweep when it ends."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if sweep_dir.is_dir():
            _, md_path = write_summary(sweep_dir)
            print(f"clorch-train: sweep summary in {md_path} (and .csv)")
            print(md_path.read_text())
