"""The sweep summary: one row per job of a `clorch-train -m` multirun.

Hydra runs each combination as its own job (each a multi-rank launch with a
fresh port) in `multirun/DATE/TIME/N/`; at the end `SweepSummaryCallback`
writes `sweep_summary.csv` and `sweep_summary.md` into the sweep directory:
one column per overridden key (the recipe included), then the job's status,
final metrics and throughput. A failed job is a
row with its status; the sweep goes on.

An interrupted sweep (Ctrl-C, SIGTERM, SIGHUP: it ends with the job it
interrupted) writes its summary too, with a row for every job it planned:
each job's status is succeeded, failed, config_error, interrupted, or
not_started for the jobs it did not reach (their overrides as planned).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Callable

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from clorch.engine.interrupts import Interrupted, at_interrupt

METRICS = ("loss", "eval_loss", "eval_exact")
RESULTS = ("status", "steps", *METRICS, "samples_per_s", "tokens_per_s", "wall_time_s")
NOT_STARTED = "not_started"  # a job an interrupted sweep did not reach


def _as_dict(overrides: list[str]) -> dict[str, str]:
    """{key: value} of override strings, `+`/`++`/`~` dropped (`+recipe=x` gives recipe: x)."""
    out = {}
    for item in overrides:
        key, _, value = str(item).lstrip("+~").partition("=")
        out[key] = value
    return out


def _overrides(job_dir: Path) -> dict[str, str]:
    """{key: value} of the job's overrides, `+`/`++` dropped (`+recipe=x` gives recipe: x)."""
    path = job_dir / ".hydra" / "overrides.yaml"
    if not path.exists():
        return {}

    return _as_dict(list(OmegaConf.load(path)))


def planned_jobs(config: DictConfig) -> list[list[str]] | None:
    """Each job's overrides, in the order Hydra's basic sweeper runs them (job N is entry N);
    None under another sweeper, or when the sweep cannot be expanded here."""
    sweeper = config.hydra.sweeper
    if sweeper.get("_target_") != f"{BasicSweeper.__module__}.{BasicSweeper.__name__}":
        return None
    params = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
    try:
        overrides = OverridesParser.create().parse_overrides([*params, *config.hydra.overrides.task])
        return [list(job) for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]
    except Exception:  # e.g. a glob over a config group, which needs Hydra's config loader
        return None


def collect(sweep_dir: Path, planned: list[list[str]] | None = None,
            interrupted: bool = False) -> list[dict[str, Any]]:
    """One row per job directory (a numbered subdirectory) of `sweep_dir`: its overrides
    (under "overrides", a {key: value} dict) and its results.

    Args:
        planned: every job's overrides (`planned_jobs`): a job without a directory
            gets a row of its own, with status not_started.
        interrupted: the sweep was interrupted: a job directory without summary.json
            is a job stopped before it could write one (status interrupted).
    """
    rows = []
    jobs = {int(p.name): p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()}
    for number in sorted(set(jobs) | set(range(len(planned or [])))):
        if number not in jobs:
            rows.append({"job": str(number), "overrides": _as_dict(planned[number]), "status": NOT_STARTED,
                         **dict.fromkeys(RESULTS[1:])})
            continue
        job_dir = jobs[number]
        path = job_dir / "summary.json"
        summary = json.loads(path.read_text()) if path.exists() else \
            {"status": "interrupted" if interrupted else "missing"}
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


def write_summary(sweep_dir: Path, planned: list[list[str]] | None = None,
                  interrupted: bool = False) -> tuple[Path, Path]:
    """Write sweep_summary.csv and sweep_summary.md; return their paths.

    Columns: job, one per overridden key (its value in that job; empty where the
    job did not set it), then the results. `planned` and `interrupted`: see `collect`.
    """
    rows = collect(sweep_dir, planned, interrupted)
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
    """Hydra callback (configured in conf/config.yaml): summarize the sweep when it ends,
    also when a signal interrupts it (Hydra then skips `on_multirun_end`)."""

    def __init__(self) -> None:
        self._cancel: Callable[[], None] | None = None
        self._planned: list[list[str]] | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        self._planned = planned_jobs(config)
        self._cancel = at_interrupt(lambda exc: self._summarize(sweep_dir, exc))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self._cancel is not None:
            self._cancel()
        self._summarize(Path(config.hydra.sweep.dir))

    def _summarize(self, sweep_dir: Path, interrupt: Interrupted | None = None) -> None:
        if not sweep_dir.is_dir():
            return  # interrupted before the sweep made its directory: no job ran
        planned = self._planned if interrupt is not None else None
        last_statuses[:] = [str(row["status"]) for row in collect(sweep_dir, planned, interrupt is not None)]
        _, md_path = write_summary(sweep_dir, planned, interrupt is not None)
        if interrupt is None:
            print(f"clorch-train: sweep summary in {md_path} (and .csv)")
        else:
            print(f"clorch-train: sweep interrupted by {interrupt.signal_name}; its summary (every job's "
                  f"status) in {md_path} (and .csv)")
        print(md_path.read_text())
