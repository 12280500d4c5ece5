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
import importlib.util
import json
import logging
import shlex
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from clorch.engine.interrupts import Interrupted, at_interrupt
from clorch.engine.outputs import command_line
from clorch.engine.results import RunSummary
from clorch.status import Status

METRICS = ("loss", "eval_loss", "eval_exact")
RESULTS = ("status", "objective", "steps", "pruned_at", *METRICS, "samples_per_s", "tokens_per_s", "wall_time_s")
RUN_DIR = "run_dir"  # the last column: where the trial's outputs are
NOT_STARTED = Status.NOT_STARTED  # a job an interrupted sweep did not reach
# The grid sweepers whose jobs are known before they run: clorch's (hydra/sweeper=basic) and Hydra's.
GRID_SWEEPERS = ("hydra_plugins.clorch_sweepers.GridSweeper", f"{BasicSweeper.__module__}.{BasicSweeper.__name__}")


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
    objective: float | None = None  # the sweep's objective (Objective) in this job's final metrics
    pruned_at: int | None = None  # a pruned trial: the step of the eval that stopped it
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
            pruned_at=summary.pruned_at,
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
    direction): by default eval_loss, or the final train loss for a job that has none, minimized."""

    name: str | None = None
    direction: str = "minimize"

    @classmethod
    def of(cls, sweeper: Any) -> "Objective":
        """The objective a sweeper's config names (Hydra's basic sweeper names none)."""
        return cls(sweeper.get("objective"), sweeper.get("direction") or "minimize")

    @property
    def label(self) -> str:
        return self.name or "eval_loss"

    def value(self, final: dict[str, Any]) -> float | None:
        value = final.get(self.name) if self.name else final.get("eval_loss", final.get("loss"))
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def best(self, rows: list["SweepRow"]) -> "SweepRow | None":
        """The succeeded row with the best objective (None: no such row)."""
        scored = [r for r in rows if r.status is Status.SUCCEEDED and r.objective is not None]
        if not scored:
            return None
        pick = max if self.direction == "maximize" else min
        return pick(scored, key=lambda r: r.objective)


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
    for number in sorted(set(jobs) | set(range(len(planned or [])))):
        if number not in jobs:
            rows.append(SweepRow(job=str(number), overrides=_as_dict(planned[number]), status=Status.NOT_STARTED))
            continue
        job_dir = jobs[number]
        row = SweepRow.of(job_dir.name, _overrides(job_dir), _summary_of(job_dir, interrupted), objective)
        row.run_dir = str(job_dir)
        rows.append(row)
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
    columns = ["job", *keys, *RESULTS, RUN_DIR]
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
        self._objective = Objective()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        self._planned = planned_jobs(config)
        self._objective = Objective.of(config.hydra.sweeper)
        self._cancel = at_interrupt(lambda exc: self._summarize(sweep_dir, exc))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self._cancel is not None:
            self._cancel()
        self._summarize(Path(config.hydra.sweep.dir))

    def _summarize(self, sweep_dir: Path, interrupt: Interrupted | None = None) -> None:
        if not sweep_dir.is_dir():
            return  # interrupted before the sweep made its directory: no job ran
        planned = self._planned if interrupt is not None else None
        rows = collect(sweep_dir, planned, interrupt is not None, self._objective)
        last_statuses[:] = [row.status for row in rows]
        _, md_path = write_summary(sweep_dir, planned, interrupt is not None, self._objective)
        if interrupt is None:
            print(f"clorch-train: sweep summary in {md_path} (and .csv)")
        else:
            print(
                f"clorch-train: sweep interrupted by {interrupt.signal_name}; its summary (every job's "
                f"status) in {md_path} (and .csv)"
            )
        print(md_path.read_text())
        for line in best_lines(rows, self._objective):
            print(line)
        plot_sweep(sweep_dir)
        if interrupt is not None:
            print(f"clorch-train: continue the sweep with: {continue_command(sweep_dir)}", file=sys.stderr)


def best_lines(rows: list[SweepRow], objective: Objective) -> list[str]:
    """The console's word on the best trial: its objective, its overrides and the command that reruns it."""
    best = objective.best(rows)
    if best is None:
        return []
    overrides = [f"{k}={v}" if k != "recipe" else f"+recipe={v}" for k, v in best.overrides.items()]
    return [
        f"clorch-train: best trial {best.job}: {objective.label} {best.objective:.6g} "
        f"({objective.direction}d) with {' '.join(overrides)}; outputs in {best.run_dir}",
        f"clorch-train: rerun it with: clorch-train {' '.join(shlex.quote(o) for o in overrides)}",
    ]


def continue_command(sweep_dir: Path) -> str:
    """The command that continues this sweep: the one typed, in the same sweep directory."""
    typed = [a for a in command_line()[1:] if not a.startswith("hydra.sweep.dir=")]
    return " ".join(shlex.quote(a) for a in ["clorch-train", *typed, f"hydra.sweep.dir={sweep_dir}"])


def plot_sweep(sweep_dir: Path) -> None:
    """With matplotlib and an Optuna study in the sweep directory: the objective per trial
    (sweep_history.png) and per parameter (sweep_params.png), by Optuna's matplotlib plots."""
    study_file = sweep_dir / "optuna.db"
    if not study_file.exists() or importlib.util.find_spec("matplotlib") is None:
        return
    try:
        import matplotlib  # lazy: optional (clorch[plot])

        matplotlib.use("Agg")
        logging.getLogger("matplotlib").setLevel(logging.WARNING)  # not its notes on category axes
        import optuna  # lazy: a sweep with an Optuna study only
        import optuna.visualization.matplotlib as plots  # lazy: as optuna

        storage = f"sqlite:///{study_file.resolve()}"
        for name in optuna.get_all_study_names(storage):
            study = optuna.load_study(study_name=name, storage=storage)
            if not any(t.state.is_finished() and t.value is not None for t in study.trials):
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
                plots.plot_optimization_history(study).figure.savefig(sweep_dir / "sweep_history.png")
                axes = plots.plot_slice(study)
                figure = axes.flat[0].figure if hasattr(axes, "flat") else axes.figure
                figure.savefig(sweep_dir / "sweep_params.png")
            print(f"clorch-train: plots in {sweep_dir / 'sweep_history.png'} and sweep_params.png")
    except Exception as exc:  # a plot is a convenience: the sweep's results are in the summary
        print(f"clorch-train: no sweep plots ({type(exc).__name__}: {exc})", file=sys.stderr)
