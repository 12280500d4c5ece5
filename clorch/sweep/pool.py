"""Run a sweep's trials side by side: each a `clorch-train` process of its own on its own slot.

A trial is a single run, as `clorch-train OVERRIDES hydra.run.dir=SWEEP_DIR/N`
would start it: it checks its own config, picks its own free port, writes its own
run directory (with its console output in `console.log`), summary.json and exit
status. The pool starts one on each free slot (clorch.sweep.slots) and reports
each that ends, so the sweeper can start the next at once (asynchronously, not in
batches). A trial that fails ends alone; the others go on.

Signals: trials start in sessions of their own, so a Ctrl-C on the terminal
reaches the sweep alone; `interrupt` passes it on to every running trial once
(each then ends as any interrupted run does: summary.json, its checkpoint kept)
and waits for them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from clorch.sweep.slots import Slot

CONSOLE = "console.log"  # a side-by-side trial's console output, in its run directory
POLL_S = 0.2


@dataclass
class Running:
    number: int
    slot: Slot
    process: subprocess.Popen
    run_dir: Path
    started: float = field(default_factory=time.monotonic)


@dataclass
class Ended:
    """A trial that ended: its number, run directory, exit status and wall time."""

    number: int
    run_dir: Path
    exit_code: int
    wall_s: float
    slot: Slot


def trial_command(overrides: list[str], run_dir: Path, hydra_args: list[str]) -> list[str]:
    """The command line of one trial: clorch-train with its overrides, in its own directory."""
    return [sys.executable, "-m", "clorch.cli", *overrides, *hydra_args, f"hydra.run.dir={_quoted(run_dir)}"]


def _quoted(path: Path) -> str:
    text = str(path)
    if all(c.isalnum() or c in "/._-" for c in text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


class Pool:
    """Trials in `slots`, at most one per slot; `hydra_args` go to every trial (hydra.job.*)."""

    def __init__(self, slots: list[Slot], hydra_args: list[str]) -> None:
        self.slots, self.hydra_args = slots, hydra_args
        self.running: dict[int, Running] = {}

    def free(self) -> list[Slot]:
        busy = {r.slot.index for r in self.running.values()}
        return [s for s in self.slots if s.index not in busy]

    def start(self, number: int, overrides: list[str], run_dir: Path, env: dict[str, str]) -> Slot:
        """Start trial `number` on a free slot (there must be one); return the slot."""
        slot = self.free()[0]
        run_dir.mkdir(parents=True, exist_ok=True)
        environ = {**os.environ, **slot.environ(), **env}
        cores = set(slot.cores)
        with open(run_dir / CONSOLE, "ab") as console:
            process = subprocess.Popen(
                trial_command(overrides, run_dir, self.hydra_args),
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                env=environ,
                start_new_session=True,  # the terminal's Ctrl-C reaches the sweep, which passes it on
                preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
            )
        self.running[number] = Running(number, slot, process, run_dir)
        return slot

    def wait(self) -> list[Ended]:
        """Block until at least one running trial ends; return those that did."""
        while self.running:
            ended = [self._ended(r) for r in list(self.running.values()) if r.process.poll() is not None]
            if ended:
                return ended
            time.sleep(POLL_S)
        return []

    def _ended(self, run: Running) -> Ended:
        del self.running[run.number]
        return Ended(run.number, run.run_dir, run.process.returncode, time.monotonic() - run.started, run.slot)

    def interrupt(self, signum: int) -> list[Ended]:
        """Pass `signum` on to every running trial, once, and wait for them all to end."""
        for run in self.running.values():
            try:
                run.process.send_signal(signum)
            except ProcessLookupError:
                pass
        ended = []
        with _ignoring(signum):  # a second Ctrl-C must not leave trials behind
            while self.running:
                ended += self.wait()
        return ended


class _ignoring:
    """Ignore the signals that end a sweep while its trials are being stopped."""

    def __init__(self, signum: int) -> None:
        self.signums = {signum, signal.SIGINT, signal.SIGTERM}
        self.saved: dict[int, object] = {}

    def __enter__(self) -> None:
        for s in self.signums:
            try:
                self.saved[s] = signal.signal(s, signal.SIG_IGN)
            except ValueError:  # not the main thread
                pass

    def __exit__(self, *exc: object) -> None:
        for s, handler in self.saved.items():
            signal.signal(s, handler)
