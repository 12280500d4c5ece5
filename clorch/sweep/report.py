"""The end of a sweep: its summary written and shown, the best trial named, the plots drawn.

`SweepSummaryCallback` (a Hydra callback, configured in conf/config.yaml) writes
sweep_summary.csv/.md when Hydra's multirun ends, or when a signal interrupts it
(clorch.sweep.summary has the rows), names the best trial with the command that
reruns it, and records each trial's status as the sweep counts it for
`clorch-train`'s exit status (`last_statuses`): a search whose trial succeeded
without the objective counts it failed, so a sweep that found no objective never
exits 0. A sweep refused before its first trial (clorch.sweep.run) summarizes
nothing: its directory may hold another sweep's trials.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shlex
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from clorch.engine.interrupts import Interrupted, at_interrupt
from clorch.config.checks import print_config_errors
from clorch.engine.outputs import command_line
from clorch.status import Status
from clorch.sweep.best import trial_overrides, write_best
from clorch.sweep.directory import BEST_FILE, PARETO_PLOT, SweepLock
from clorch.sweep.driver import RESUME
from clorch.sweep.summary import Objective, SweepRow, collect, planned_jobs, write_summary
from clorch.runs.commands import rerun_command
from clorch.runs.records import Run

# The statuses of the last sweep's jobs, read by `clorch-train` for its exit status: with
# hydra/launcher=submitit_* the jobs run in other processes, which report only through their
# summary.json files.
last_statuses: list[Status] = []


class _SweepEnd:
    """What the running sweep (clorch.sweep.run) leaves for its end: its directory's lock,
    held until the summary is written; whether it was refused or failed before its end."""

    def __init__(self) -> None:
        self.lock: SweepLock | None = None
        self.refused: Status | None = None  # refused before its first trial: the sweep's status
        self.failed = False
        self.ran_trials = False  # this process ran a sweep's trials (clorch-train then exits at once)

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None


SWEEP_END = _SweepEnd()


def hold_until_summarized(lock: SweepLock) -> None:
    """Keep the sweep directory's `lock` until the sweep's summary is written."""
    SWEEP_END.lock = lock


def refused(errors: list[str], status: Status = Status.CONFIG_ERROR) -> None:
    """The sweep was refused before its first trial: say why; nothing is summarized (its directory
    may hold another sweep's trials); it ends with `status` (a config error: exit 2; a storage
    that cannot be used: failed, exit 1)."""
    if status is Status.CONFIG_ERROR:
        print_config_errors(errors)
    else:
        for error in errors:
            print(f"clorch-train: the sweep did not start: {error}", file=sys.stderr, flush=True)
    SWEEP_END.refused = status
    SWEEP_END.release()


def failed(message: str) -> None:
    """The sweep itself failed (its study's storage): say it in one line; the sweep exits 1."""
    print(f"clorch-train: the sweep stopped: {message}", file=sys.stderr, flush=True)
    SWEEP_END.failed = True


class SweepSummaryCallback(Callback):
    """Hydra callback (configured in conf/config.yaml): summarize the sweep when it ends,
    also when a signal interrupts it (Hydra then skips `on_multirun_end`)."""

    def __init__(self) -> None:
        self._cancel: Callable[[], None] | None = None
        self._planned: list[list[str]] | None = None
        self._objective = Objective()
        self._overrides: list[str] = []  # the sweep's command line (task and hydra overrides)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        SWEEP_END.release()
        SWEEP_END.refused, SWEEP_END.failed = None, False
        sweep_dir = Path(config.hydra.sweep.dir)
        self._planned = planned_jobs(config)
        self._objective = Objective.of(config.hydra.sweeper)
        self._overrides = [*config.hydra.overrides.task, *config.hydra.overrides.hydra]
        self._cancel = at_interrupt(lambda exc: self._summarize(sweep_dir, exc))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self._cancel is not None:
            self._cancel()
        self._summarize(Path(config.hydra.sweep.dir))

    def _summarize(self, sweep_dir: Path, interrupt: Interrupted | None = None) -> None:
        try:
            if SWEEP_END.refused is not None:
                last_statuses[:] = [SWEEP_END.refused]
            elif sweep_dir.is_dir():  # else interrupted before the sweep made its directory: no job ran
                self._write(sweep_dir, interrupt)
        finally:
            SWEEP_END.release()

    def _write(self, sweep_dir: Path, interrupt: Interrupted | None) -> None:
        planned = self._planned if interrupt is not None else None
        rows = collect(sweep_dir, planned, interrupt is not None, self._objective)
        last_statuses[:] = [self._objective.counted_status(row) for row in rows]
        if SWEEP_END.failed:
            last_statuses.append(Status.FAILED)
        _, md_path = write_summary(sweep_dir, planned, interrupt is not None, self._objective)
        if interrupt is None:
            print(f"clorch-train: sweep summary in {md_path} (and .csv)")
        else:
            print(
                f"clorch-train: sweep interrupted by {interrupt.signal_name}; its summary (every job's "
                f"status) in {md_path} (and .csv)"
            )
        print(md_path.read_text())
        found = front_lines(rows, self._objective) if self._objective.several else best_lines(rows, self._objective)
        for line in found or no_objective_lines(rows, self._objective):
            print(line)
        best = self._objective.best(rows)
        if best is not None and interrupt is None:  # an interrupted sweep's best is not yet its best
            print(best_file_line(sweep_dir, best, self._objective, self._overrides))
        plot_sweep(sweep_dir)
        if interrupt is not None:
            print(f"clorch-train: continue the sweep with: {continue_command(sweep_dir)}", file=sys.stderr)


def best_lines(rows: list[SweepRow], objective: Objective) -> list[str]:
    """The console's word on the best trial: its objective, its overrides and the command that reruns it."""
    best = objective.best(rows)
    if best is None:
        return []
    overrides = [
        f"{k}={v}" if k != "recipe" else f"+recipe={v}" for k, v in best.overrides.items() if f"{k}={v}" != RESUME
    ]
    return [
        f"clorch-train: best trial {best.job}: {objective.label} {best.objective:.6g} "
        f"({objective.direction}d) with {' '.join(overrides)}; outputs in {best.run_dir}",
        # clorch-runs show's command: recipe files by path, CLORCH_TRUSTED_MODULES, from scratch
        f"clorch-train: rerun it with: {rerun_command(Run(Path(best.run_dir)), cd=False)}",
    ]


def front_lines(rows: list[SweepRow], objective: Objective) -> list[str]:
    """The console's word on a sweep of several objectives: its Pareto front, each trial with its
    values and the command that reruns it (no trial is best alone: no best.yaml)."""
    front = objective.front(rows)
    if not front:
        return []
    ways = [objective.direction, *(d for _, d in objective.others)]
    names = [objective.name, *(n for n, _ in objective.others)]
    lines = [
        f"clorch-train: the Pareto front of {' and '.join(f'{n} ({w}d)' for n, w in zip(names, ways, strict=True))}: "
        f"{len(front)} trial(s), none beaten on every objective by another (Optuna's study.best_trials)"
    ]
    for row in front:
        values = ", ".join(f"{n} {v:.6g}" for n, v in zip(names, row.objective, strict=True))
        rerun = rerun_command(Run(Path(row.run_dir)), cd=False)
        lines.append(f"clorch-train:   trial {row.job}: {values}; rerun it with: {rerun}")
    return lines


def best_file_line(sweep_dir: Path, best: SweepRow, objective: Objective, sweep_overrides: list[str]) -> str:
    """Write the best trial's recipe (clorch.sweep.best) and say where it is, or why there is none."""
    overrides = trial_overrides(sweep_overrides, best.overrides)
    about = f"The best trial ({best.job}) of the sweep in {sweep_dir}: {objective.label} {best.objective:.6g}"
    try:
        if overrides is None:
            raise ValueError("the sweep's command line cannot be read again")
        path = write_best(sweep_dir, overrides, f"{about} ({objective.direction}d)")
    except Exception as exc:  # a convenience, as the plots are: the sweep's results are in the summary
        return f"clorch-train: no {BEST_FILE} for the best trial ({type(exc).__name__}: {exc})"
    return f"clorch-train: the best trial's config as a recipe: {path}; rerun it with: clorch-train +recipe={path}"


def no_objective_lines(rows: list[SweepRow], objective: Objective) -> list[str]:
    """The console's word on a search whose succeeded trials all lack the objective (the sweep failed)."""
    lacking = [r for r in rows if r.status is Status.SUCCEEDED and r.objective is None]
    if not objective.required or not lacking:
        return []
    found = sorted({name for row in lacking for name in _final_metrics(row)})
    return [
        f"clorch-train: no trial reported the objective {objective.label} (hydra.sweeper.objective) as a finite "
        f"number in its final metrics; they have: {', '.join(found) or 'none'}. The sweep failed: set "
        "hydra.sweeper.objective to one of those"
    ]


def _final_metrics(row: SweepRow) -> list[str]:
    try:
        return list(json.loads(Path(str(row.run_dir), "summary.json").read_text()).get("final") or {})
    except (OSError, ValueError, AttributeError):
        return []


def continue_command(sweep_dir: Path) -> str:
    """The command that continues this sweep: the one typed, in the same sweep directory."""
    typed = [a for a in command_line()[1:] if not a.startswith("hydra.sweep.dir=")]
    return " ".join(shlex.quote(a) for a in ["clorch-train", *typed, f"hydra.sweep.dir={sweep_dir}"])


def _readable_ticks(figure: Any) -> None:
    """Readable x tick labels on the parameters' axes. A log axis over two or three decades had
    its minor ticks labelled too (2e-3, 3e-3, 4e-3, ...), running into each other: where a decade
    or more is shown, the minor ticks stay unlabelled; labels are slanted and smaller.
    The colour bar stands beside the last axis, not over it."""
    from matplotlib.ticker import NullFormatter  # lazy: as the plots (clorch[plot])

    plots = [ax for ax in figure.axes if ax.get_label() != "<colorbar>"]
    for ax in plots:
        low, high = sorted(ax.get_xlim())
        if ax.get_xscale() == "log" and low > 0 and high / low >= 10:  # a decade or more: majors say it
            ax.xaxis.set_minor_formatter(NullFormatter())
        for label in [*ax.get_xticklabels(), *ax.get_xticklabels(minor=True)]:
            label.set_rotation(45)
            label.set_horizontalalignment("right")
            label.set_fontsize("x-small")
    figure.set_size_inches(3.6 * len(plots) + 1.6, 4.8)
    figure.subplots_adjust(bottom=0.2, right=0.86)
    for ax in figure.axes:
        if ax.get_label() == "<colorbar>":
            ax.set_position([0.89, 0.2, 0.015, 0.68])


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
            if not any(t.state.is_finished() and t.values is not None for t in study.trials):
                continue
            if len(study.directions) > 1:  # several objectives: their Pareto front
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
                    plots.plot_pareto_front(study).figure.savefig(sweep_dir / PARETO_PLOT)
                print(f"clorch-train: plot of the Pareto front in {sweep_dir / PARETO_PLOT}")
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
                plots.plot_optimization_history(study).figure.savefig(sweep_dir / "sweep_history.png")
                axes = plots.plot_slice(study)
                figure = axes.flat[0].figure if hasattr(axes, "flat") else axes.figure
                _readable_ticks(figure)
                figure.savefig(sweep_dir / "sweep_params.png")
            print(f"clorch-train: plots in {sweep_dir / 'sweep_history.png'} and sweep_params.png")
    except Exception as exc:  # a plot is a convenience: the sweep's results are in the summary
        print(f"clorch-train: no sweep plots ({type(exc).__name__}: {exc})", file=sys.stderr)
