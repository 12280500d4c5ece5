"""The sweep summary: one row per job of a `clorch-train -m` multirun (written by clorch.sweep.report).

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
import math
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, ListConfig, OmegaConf

from clorch.engine.results import RunSummary
from clorch.status import Status
from clorch.sweep._private_apis import BASIC_SWEEPER, grid_combinations
from clorch.sweep.objectives import as_list, pareto_front

METRICS = ("loss", "eval_loss", "eval_exact")
RESULTS = ("status", "objective", "steps", "pruned_at", *METRICS, "samples_per_s", "tokens_per_s", "wall_time_s")
RUN_DIR = "run_dir"  # the last column: where the trial's outputs are
NOT_STARTED = Status.NOT_STARTED  # a job an interrupted sweep did not reach
# The grid sweepers whose jobs are known before they run: clorch's (hydra/sweeper=basic) and Hydra's.
GRID_SWEEPERS = ("hydra_plugins.clorch_sweepers.GridSweeper", BASIC_SWEEPER)
OPTUNA_SWEEPER = "hydra_plugins.clorch_sweepers.OptunaSweeper"  # its trials must report the objective


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
    if sweeper.get("_target_") not in GRID_SWEEPERS:
        return None
    params = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
    try:
        overrides = OverridesParser.create().parse_overrides([*params, *config.hydra.overrides.task])
        return grid_combinations(overrides)
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
    objective: float | tuple[float, ...] | None = None  # the sweep's objective (Objective), or its several
    pareto: bool | None = None  # several objectives: whether the job is on the Pareto front
    pruned_at: int | None = None  # a pruned or paused (ASHA) trial: the step of the eval that stopped it
    run_dir: str | None = None

    @classmethod
    def of(
        cls, job: str, overrides: dict[str, str], summary: RunSummary, objective: "Objective | None" = None
    ) -> "SweepRow":
        return cls(
            job=job,
            overrides=overrides,
            status=summary.status,
            objective=(objective or Objective()).value(summary.final),
            pruned_at=summary.pruned_at if summary.paused_at is None else summary.paused_at,
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
            "objective": self.objective,
            **({"pareto": self.pareto} if self.pareto is not None else {}),
            "steps": self.steps,
            "pruned_at": self.pruned_at,
            **self.metrics,
            "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            "wall_time_s": self.wall_time_s,
        }

    def cells(self, keys: list[str]) -> dict[str, Any]:
        """The row of sweep_summary.csv: job, the override `keys`, the results, the run directory."""
        return {"job": self.job, **{k: self.overrides.get(k) for k in keys}, **self.results(), RUN_DIR: self.run_dir}

    def __getitem__(self, column: str) -> Any:
        """A column's value, as sweep_summary.csv names it ("overrides": the {key: value} dict)."""
        return self.overrides if column == "overrides" else self.cells(list(self.overrides))[column]


def _summary_of(job_dir: Path, interrupted: bool) -> RunSummary:
    """The job's summary.json; without one, interrupted (the sweep was) or missing."""
    path = job_dir / "summary.json"
    if not path.exists():
        return RunSummary(status=Status.INTERRUPTED if interrupted else Status.MISSING, steps=None)
    return RunSummary.from_dict(json.loads(path.read_text()))


@dataclass(frozen=True)
class Objective:
    """Which final metric ranks a sweep's trials, and which way (hydra.sweeper.objective,
    direction): by default eval_loss, or the final train loss for a job that has none, minimized.
    With several objectives (clorch.sweep.objectives) no trial is best alone: `front` names the
    Pareto front."""

    name: str | None = None
    direction: str = "minimize"
    required: bool = False  # a search (the Optuna sweeper): a trial without it failed, as its study says
    others: tuple[tuple[str, str], ...] = ()  # several objectives: (name, direction) of each after the first

    @classmethod
    def of(cls, sweeper: Any) -> "Objective":
        """The objective a sweeper's config names (Hydra's basic sweeper names none)."""
        required = sweeper.get("_target_") == OPTUNA_SWEEPER
        names = as_list(_plain(sweeper.get("objective")))
        directions = as_list(_plain(sweeper.get("direction") or "minimize"))
        return cls(names[0], directions[0], required, tuple(zip(names[1:], directions[1:], strict=False)))

    @property
    def several(self) -> bool:
        return bool(self.others)

    @property
    def label(self) -> str:
        return ", ".join([self.name or "eval_loss", *(name for name, _ in self.others)])

    def value(self, final: dict[str, Any]) -> float | tuple[float, ...] | None:
        """The objective in a job's final metrics; None without one, or when it is not a finite number
        (a NaN loss ranks nothing). Several objectives: the value of each, or None without them all."""
        if self.several:
            values = [_finite(final.get(name)) for name in [self.name, *(n for n, _ in self.others)]]
            return None if None in values else tuple(values)
        return _finite(final.get(self.name) if self.name else final.get("eval_loss", final.get("loss")))

    def counted_status(self, row: "SweepRow") -> Status:
        """The row's status as the sweep counts it: a search's trial that succeeded without a
        finite objective failed (its study recorded it so)."""
        if self.required and row.status is Status.SUCCEEDED and row.objective is None:
            return Status.FAILED
        return row.status

    def best(self, rows: list["SweepRow"]) -> "SweepRow | None":
        """The succeeded row with the best objective (None: no such row, or several objectives)."""
        scored = [r for r in rows if r.status is Status.SUCCEEDED and r.objective is not None]
        if not scored or self.several:
            return None
        pick = max if self.direction == "maximize" else min
        return pick(scored, key=lambda r: r.objective)

    def front(self, rows: list["SweepRow"]) -> list["SweepRow"]:
        """Several objectives: the succeeded rows that no other beats on every objective (the
        Pareto front, Optuna's study.best_trials), in job order."""
        scored = [r for r in rows if r.status is Status.SUCCEEDED and r.objective is not None]
        directions = [self.direction, *(d for _, d in self.others)]
        return [scored[i] for i in pareto_front([r.objective for r in scored], directions)]


def _plain(value: Any) -> Any:
    """A config value as plain data (a ListConfig as a list)."""
    return OmegaConf.to_container(value) if isinstance(value, ListConfig) else value


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _one_metric(objective: Objective, summaries: Iterable[RunSummary]) -> Objective:
    """The default objective made one metric for the whole sweep: eval_loss where any trial
    evaluated, else the final train loss. A trial cut off before its eval then has no objective,
    rather than its train loss ranked among the others' eval losses."""
    if objective.name is not None:
        return objective
    evaluated = any("eval_loss" in (summary.final or {}) for summary in summaries)
    return dataclasses.replace(objective, name="eval_loss" if evaluated else "loss")


def collect(
    sweep_dir: Path,
    planned: list[list[str]] | None = None,
    interrupted: bool = False,
    objective: Objective | None = None,
) -> list[SweepRow]:
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
    summaries = {number: _summary_of(job_dir, interrupted) for number, job_dir in jobs.items()}
    objective = _one_metric(objective or Objective(), summaries.values())
    for number in sorted(set(jobs) | set(range(len(planned or [])))):
        if number not in jobs:
            rows.append(SweepRow(job=str(number), overrides=_as_dict(planned[number]), status=Status.NOT_STARTED))
            continue
        job_dir = jobs[number]
        row = SweepRow.of(job_dir.name, _overrides(job_dir), summaries[number], objective)
        row.run_dir = str(job_dir)
        rows.append(row)
    if objective is not None and objective.several:
        front = {id(r) for r in objective.front(rows)}
        for row in rows:
            row.pareto = id(row) in front
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
    if isinstance(value, tuple):  # several objectives
        return ", ".join(f"{v:.4g}" for v in value)
    return str(value)


def write_summary(
    sweep_dir: Path,
    planned: list[list[str]] | None = None,
    interrupted: bool = False,
    objective: Objective | None = None,
) -> tuple[Path, Path]:
    """Write sweep_summary.csv and sweep_summary.md; return their paths.

    Columns: job, one per overridden key (its value in that job; empty where the
    job did not set it), then the results (the objective, the step a pruned trial
    stopped at), then the job's run directory. `planned` and `interrupted`: see `collect`.
    """
    rows = collect(sweep_dir, planned, interrupted, objective)
    keys = override_columns(rows)
    results = [*RESULTS[:2], "pareto", *RESULTS[2:]] if objective is not None and objective.several else RESULTS
    columns = ["job", *keys, *results, RUN_DIR]
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
