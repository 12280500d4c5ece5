"""The sweep summary: one row per job of a `clorch-train -m` multirun.

Hydra runs each combination as its own job (each a multi-rank launch with a
fresh port) in `multirun/DATE/TIME/N/`; at the end `SweepSummaryCallback`
writes `sweep_summary.csv` and `sweep_summary.md` into the sweep directory:
one column per overridden key (the recipe included), then the job's status,
final metrics and throughput. A failed job is a
row with its status; the sweep goes on.

An interrupted sweep (Ctrl-C, SIGTERM, SIGHUP: it ends with the job it
interrupted) writes its summary too, with a row for every job it planned:
each job's status (clorch.status.Status) is succeeded, failed,
preflight_failed, config_error, interrupted, or not_started for the jobs it did
not reach (their overrides as planned). A job whose preflight failed is a
failed job: the sweep exits 1.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from clorch.engine.interrupts import Interrupted, at_interrupt
from clorch.engine.results import RunSummary
from clorch.status import Status

METRICS = ("loss", "eval_loss", "eval_exact")
RESULTS = ("status", "steps", *METRICS, "samples_per_s", "tokens_per_s", "wall_time_s")
NOT_STARTED = Status.NOT_STARTED  # a job an interrupted sweep did not reach


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


@dataclass
class SweepRow:
    """One job of a sweep: its number, its overrides ({key: value}) and its results.

    sweep_summary.csv and .md have one column per field (the overrides spread into a
    column per key, `metrics` into loss, eval_loss, eval_exact), as they always had.
    """

    job: str
    overrides: dict[str, str] = field(default_factory=dict)
    status: Status = Status.MISSING
    steps: int | None = None
    metrics: dict[str, float | None] = field(default_factory=lambda: dict.fromkeys(METRICS))
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    wall_time_s: float | None = None

    @classmethod
    def of(cls, job: str, overrides: dict[str, str], summary: RunSummary) -> "SweepRow":
        return cls(
            job=job,
            overrides=overrides,
            status=summary.status,
            steps=summary.steps,
            metrics={m: summary.final.get(m) for m in METRICS},
            samples_per_s=summary.samples_per_s,
            tokens_per_s=summary.tokens_per_s,
            wall_time_s=summary.wall_time_s,
        )

    def results(self) -> dict[str, Any]:
        """The result columns (RESULTS), by name."""
        return {
            "status": str(self.status),
            "steps": self.steps,
            **self.metrics,
            "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            "wall_time_s": self.wall_time_s,
        }

    def cells(self, keys: list[str]) -> dict[str, Any]:
        """The row of sweep_summary.csv: job, the override `keys`, then the results."""
        return {"job": self.job, **{k: self.overrides.get(k) for k in keys}, **self.results()}

    def __getitem__(self, column: str) -> Any:
        """A column's value, as sweep_summary.csv names it ("overrides": the {key: value} dict)."""
        return self.overrides if column == "overrides" else self.cells(list(self.overrides))[column]


def _summary_of(job_dir: Path, interrupted: bool) -> RunSummary:
    """The job's summary.json; without one, interrupted (the sweep was) or missing."""
    path = job_dir / "summary.json"
    if not path.exists():
        return RunSummary(status=Status.INTERRUPTED if interrupted else Status.MISSING, steps=None)
    return RunSummary.from_dict(json.loads(path.read_text()))


def collect(sweep_dir: Path, planned: list[list[str]] | None = None, interrupted: bool = False) -> list[SweepRow]:
    """One row per job directory (a numbered subdirectory) of `sweep_dir`: its overrides
    and its results.

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
            rows.append(SweepRow(job=str(number), overrides=_as_dict(planned[number]), status=Status.NOT_STARTED))
            continue
        job_dir = jobs[number]
        rows.append(SweepRow.of(job_dir.name, _overrides(job_dir), _summary_of(job_dir, interrupted)))
    return rows


def override_columns(rows: list[SweepRow]) -> list[str]:
    """Every key some job overrode, in the order first seen: one column each (recipe included)."""
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row.overrides))
    return list(keys)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def write_summary(
    sweep_dir: Path, planned: list[list[str]] | None = None, interrupted: bool = False
) -> tuple[Path, Path]:
    """Write sweep_summary.csv and sweep_summary.md; return their paths.

    Columns: job, one per overridden key (its value in that job; empty where the
    job did not set it), then the results. `planned` and `interrupted`: see `collect`.
    """
    rows = collect(sweep_dir, planned, interrupted)
    keys = override_columns(rows)
    columns = ["job", *keys, *RESULTS]
    flat = [row.cells(keys) for row in rows]
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
last_statuses: list[Status] = []


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
        last_statuses[:] = [row.status for row in collect(sweep_dir, planned, interrupt is not None)]
        _, md_path = write_summary(sweep_dir, planned, interrupt is not None)
        if interrupt is None:
            print(f"clorch-train: sweep summary in {md_path} (and .csv)")
        else:
            print(
                f"clorch-train: sweep interrupted by {interrupt.signal_name}; its summary (every job's "
                f"status) in {md_path} (and .csv)"
            )
        print(md_path.read_text())
