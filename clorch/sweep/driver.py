"""The loop every clorch sweep runs: start trials while there is room, read each that ends.

A *source* decides the trials (the grid's combinations, or Optuna's suggestions
one at a time) and learns how each ended; a *runner* runs them:

    HydraRunner   Hydra's launcher: in this process, one at a time (n_jobs=1), or a
                  submitit launcher's jobs, n_jobs at a time (each trial a job of its own)
    PoolRunner    clorch-train processes side by side, n_jobs at a time, each on its own
                  GPUs or cores (clorch.sweep.pool); a new trial starts as soon as one ends

Every trial writes its run directory SWEEP_DIR/N (N: the trial's number) with its
summary.json, which is how the source learns its status and objective, wherever
it ran. A signal (Ctrl-C) stops the running trials as interrupted runs; the sweep
then ends with `Interrupted`, and running the same command again continues it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Protocol

import yaml

from clorch.config.composer import format_value
from clorch.engine.interrupts import Interrupted, raise_if_signalled
from clorch.engine.results import RunSummary
from clorch.status import Status
from clorch.sweep._private_apis import runs_in_process
from clorch.sweep.pool import Pool
from clorch.sweep.slots import Slot


RESUME = "checkpoint.resume=latest"  # added to a cut-off trial that writes checkpoints
# What a trial's summary says when the trial was cut off (a sweep that continues runs it again).
UNFINISHED = (Status.INTERRUPTED, Status.MISSING, Status.KILLED, Status.UNKNOWN, Status.RUNNING)


def writes_checkpoints(run_dir: Path) -> bool:
    """Whether the trial in `run_dir` writes checkpoints (its config.yaml says so)."""
    try:
        config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return False
    return (config.get("checkpoint") or {}).get("policy", "none") != "none"


@dataclass
class TrialSpec:
    """One trial to run: its number (its directory's name), its overrides, its environment."""

    number: int
    overrides: list[str]
    env: dict[str, str] = field(default_factory=dict)
    label: str = ""  # what the console says of it (its parameters)


class Source(Protocol):
    def next(self) -> TrialSpec | None:
        """The next trial to start, or None: none now (all planned, or n_trials reached)."""

    def ended(self, spec: TrialSpec, summary: RunSummary) -> None:
        """Trial `spec` ended with `summary` (its summary.json; status missing without one)."""


def summary_in(run_dir: Path) -> RunSummary:
    """A trial's summary.json, or a summary with status missing (it wrote none)."""
    path = run_dir / "summary.json"
    try:
        return RunSummary.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return RunSummary(status=Status.MISSING)


def say(text: str) -> None:
    print(f"clorch-train: {text}", flush=True)


class HydraRunner:
    """Trials through Hydra's launcher, `capacity` at a time (a blocking batch)."""

    def __init__(self, launcher: Any, sweep_dir: Path, capacity: int) -> None:
        self.launcher, self.sweep_dir, self.capacity = launcher, sweep_dir, capacity
        self.queued: list[TrialSpec] = []

    def has_room(self) -> bool:
        return len(self.queued) < self.capacity

    def busy(self) -> bool:
        return bool(self.queued)

    def start(self, spec: TrialSpec) -> None:
        self.queued.append(spec)

    def wait(self) -> list[tuple[TrialSpec, Path]]:
        batch, self.queued = self.queued, []
        ended: list[tuple[TrialSpec, Path]] = []
        for group in _consecutive(batch):  # Hydra numbers a batch's jobs from its first one on
            if len(group) == 1 and runs_in_process(self.launcher):
                # The job runs here: its environment is this process's while it runs, and the
                # console's line of its overrides shows the user's keys only.
                with _environment(group[0].env):
                    self.launcher.launch([group[0].overrides], initial_job_idx=group[0].number)
            else:
                # hydra.job.env_set: the environment of the job wherever Hydra's launcher runs it
                lists = [
                    [*s.overrides, *(f"++hydra.job.env_set.{k}={format_value(v)}" for k, v in s.env.items())]
                    for s in group
                ]
                self.launcher.launch(lists, initial_job_idx=group[0].number)
            ended += [(s, self.sweep_dir / str(s.number)) for s in group]
        return ended

    def interrupt(self, signum: int) -> list[tuple[TrialSpec, Path]]:
        self.queued = []  # the job that was running has ended as an interrupted run already
        return []


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """`env` in os.environ while the block runs; what was there before, after it."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _consecutive(specs: list[TrialSpec]) -> list[list[TrialSpec]]:
    groups: list[list[TrialSpec]] = []
    for spec in sorted(specs, key=lambda s: s.number):
        if groups and groups[-1][-1].number + 1 == spec.number:
            groups[-1].append(spec)
        else:
            groups.append([spec])
    return groups


class PoolRunner:
    """Trials as clorch-train processes side by side (clorch.sweep.pool), one per slot."""

    def __init__(self, slots: list[Slot], sweep_dir: Path, hydra_args: list[str]) -> None:
        self.pool, self.sweep_dir = Pool(slots, hydra_args), sweep_dir
        self.specs: dict[int, TrialSpec] = {}

    def has_room(self) -> bool:
        return bool(self.pool.free())

    def busy(self) -> bool:
        return bool(self.pool.running)

    def start(self, spec: TrialSpec) -> None:
        slot = self.pool.start(spec.number, spec.overrides, self.sweep_dir / str(spec.number), spec.env)
        self.specs[spec.number] = spec
        say(f"trial {spec.number} started on {slot.describe()}: {spec.label}")

    def wait(self) -> list[tuple[TrialSpec, Path]]:
        return [(self.specs.pop(e.number), e.run_dir) for e in self.pool.wait()]

    def interrupt(self, signum: int) -> list[tuple[TrialSpec, Path]]:
        return [(self.specs.pop(e.number), e.run_dir) for e in self.pool.interrupt(signum)]


def run_trials(source: Source, runner: HydraRunner | PoolRunner, show_ends: bool) -> None:
    """Start trials while the runner has room and the source has one; tell the source of each end.

    Raises:
        Interrupted: a signal stopped the sweep (the running trials were stopped first and
            the source told how they ended).
        Exception: what the source raised (the running trials were stopped first, untold).
    """
    try:
        while True:
            while runner.has_room():
                spec = source.next()
                if spec is None:
                    break
                raise_if_signalled()  # no new trial once a signal has fired, even one whose Interrupted was dropped
                runner.start(spec)
            if not runner.busy():
                return
            for spec, run_dir in runner.wait():
                _tell(source, spec, run_dir, show_ends)
    except Interrupted as exc:
        for spec, run_dir in runner.interrupt(exc.signum):
            _tell(source, spec, run_dir, show_ends)
        raise
    except Exception:  # the source failed (its study's storage): no trial outlives the sweep
        runner.interrupt(signal.SIGTERM)
        raise


def _tell(source: Source, spec: TrialSpec, run_dir: Path, show: bool) -> None:
    summary = summary_in(run_dir)
    source.ended(spec, summary)
    if show:
        where = f"; console output in {run_dir / 'console.log'}" if summary.status.failed else ""
        stopped = summary.pruned_at if summary.paused_at is None else summary.paused_at
        step = f" at step {stopped}" if stopped is not None else ""
        print(f"clorch-train: trial {spec.number} {summary.status}{step}{where}", file=sys.stdout, flush=True)
