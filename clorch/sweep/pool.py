"""Run a sweep's trials side by side: each a `clorch-train` process of its own on its own slot.

A trial is a single run, as `clorch-train OVERRIDES hydra.run.dir=SWEEP_DIR/N`
would start it: it checks its own config, picks its own free port, writes its own
run directory (with its console output in `console.log`), summary.json and exit
status. It is forked from a server process that imported torch, clorch's command
line and matplotlib (for loss.png) once (multiprocessing's forkserver), so a trial
does not pay for a fresh interpreter and those imports (seconds) again; its ranks
start as any run's do. The pool starts one on each free slot (clorch.sweep.slots)
and reports each that ends, so the sweeper can start the next at once
(asynchronously, not in batches). A trial that fails ends alone; the others go on.

Signals: trials start in sessions of their own, so a Ctrl-C on the terminal
reaches the sweep alone; `interrupt` passes it on to every running trial once
(each then ends as any interrupted run does: summary.json, its checkpoint kept)
and waits for them.
"""

from __future__ import annotations

import functools
import gc
import multiprocessing as mp
from multiprocessing import forkserver
import os
import runpy
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clorch.config.composer import format_value, recipe_file
from clorch.config.overrides import compose_once
from clorch.engine import in_process
from clorch.launch.procs import set_parent_death_signal
from clorch.sweep.slots import ALONE_CPU_RANKS, Slot

CONSOLE = "console.log"  # a side-by-side trial's console output, in its run directory
POLL_S = 0.2
# What the trials' server imports once, so that no trial imports it again (seconds in all): the
# command line, a rank's worker (torch.distributed.tensor), torch._dynamo (every optimizer's
# constructor imports it), the study a trial reports to, and matplotlib for each loss.png. The
# server skips a module that does not import (an extra not installed).
PRELOADED = (
    "torch",
    "torch._dynamo",
    "clorch.cli.train",
    "clorch.engine.as_rank",
    "clorch.train.worker",
    "optuna",
    "matplotlib.pyplot",
)


@dataclass
class Running:
    number: int
    slot: Slot
    process: Any  # a multiprocessing Process, or an _Interpreter
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


def trial_args(overrides: list[str], run_dir: Path, hydra_args: list[str]) -> list[str]:
    """clorch-train's arguments for one trial: its overrides, in its own directory.

    A recipe file is registered under a name (`+recipe=file_NAME`) in the process that read the
    command line; a trial is a clorch-train process of its own, so it gets the file's path again.
    """
    return [*map(_recipe_path, overrides), *hydra_args, f"hydra.run.dir={format_value(str(run_dir))}"]


def _key(override: str) -> str:
    return override.partition("=")[0].lstrip("+~")


def _recipe_path(override: str) -> str:
    key, sep, value = override.partition("=")
    path = recipe_file(value) if sep and _key(override) == "recipe" else None
    return f"{key}={format_value(str(path))}" if path is not None else override


def sized_to_slot(overrides: list[str], slot: Slot) -> tuple[list[str], str | None]:
    """A trial's overrides on `slot`, and what they change (None: nothing).

    A trial whose ranks are `auto` (launcher.nproc_per_node) runs its slot's ranks, which may be
    fewer than a run alone gets (clorch.sweep.slots.ranks_per_trial); it then accumulates as many
    micro-batches more, so that its global batch (batch_size x ranks x accumulation), its steps and
    so its result are a lone run's, whatever n_jobs (as a resume onto fewer ranks keeps the
    checkpoint's global batch). A trial whose config does not compose is left as it is: it
    reports its own errors.
    """
    if slot.alone == slot.ranks and not slot.gpus:  # CPU, one trial at a time: a run alone's ranks
        return overrides, None
    config = _sizing_config(tuple(o for o in overrides if _sizes(o)))
    launcher = (config.get("launcher") if config is not None else None) or {}
    if launcher.get("name") != "local" or launcher.get("nproc_per_node") != "auto" or launcher.get("devices"):
        return overrides, None
    on_gpus = bool(slot.gpus) and config.get("backend") in ("auto", "nccl")
    alone = slot.alone if on_gpus else ALONE_CPU_RANKS
    ranks = slot.ranks if on_gpus or not slot.gpus else ALONE_CPU_RANKS  # gloo ranks on a GPU machine: 2
    if ranks == alone:
        return overrides, None
    assert alone % ranks == 0, (alone, ranks)  # ranks_per_trial picks a divisor
    accumulation = int(config.get("accumulation") or 1) * alone // ranks
    change = (
        f"launcher.nproc_per_node=auto is {alone} rank(s) for a run alone; a trial side by side runs {ranks} "
        f"with accumulation={accumulation}: the same global batch"
    )
    kept = [o for o in overrides if _key(o) not in ("launcher.nproc_per_node", "accumulation")]
    return [*kept, f"launcher.nproc_per_node={ranks}", f"accumulation={accumulation}"], change


def _sizes(override: str) -> bool:
    """Whether an override may change what sized_to_slot reads: a group choice or recipe (no dot in
    its key), or a key of the launcher, the backend or accumulation. A searched key such as
    optim.lr does not, so a sweep composes its trials' sizing once."""
    key = _key(override)
    return not key.startswith("hydra") and ("." not in key or key.split(".")[0] in _SIZING_KEYS)


_SIZING_KEYS = ("launcher", "backend", "accumulation")


@functools.lru_cache(maxsize=64)
def _sizing_config(overrides: tuple[str, ...]) -> Any:
    """The config `overrides` compose to (None: they do not), composed once per distinct set."""
    return compose_once(list(overrides))[0]


def _end_with_the_server() -> None:
    """SIGTERM this trial when its parent, the trials' server, ends: the server ends with the sweep
    (multiprocessing's forkserver leaves once its client has gone), so a sweep that was killed
    leaves no trial training on unwatched; the trial ends as an interrupted run, which continuing
    the sweep resumes. A server already gone (before the request took effect): end now."""
    server = os.getppid()
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != server:
        os._exit(128 + signal.SIGTERM)


def _trial_main(args: list[str], env: dict[str, str], cores: set[int], console: str | None) -> None:
    """A trial's process (forked from the server): its own session, cores, environment and
    console (None: the sweep's terminal), then clorch-train's own main."""
    os.setsid()  # the terminal's Ctrl-C reaches the sweep, which passes it on
    _end_with_the_server()
    gc.freeze()  # what the server imported lives as long as the trial: never rescanned (clorch._gc)
    if cores:
        os.sched_setaffinity(0, cores)
    os.environ.update(env)
    if console is not None:
        fd = os.open(console, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for stream in (1, 2):
            os.dup2(fd, stream)
        os.close(fd)
    sys.argv = ["clorch-train", *args]
    in_process.allow()  # a one-rank trial trains in this process, torch already imported
    # As `python -m clorch.cli ARGS` runs it (the server imported it already), exit status included.
    runpy.run_module("clorch.cli", run_name="__main__", alter_sys=True)


# `python -m clorch.cli ARGS`, its one-rank job trained in that process (clorch.engine.in_process)
_TRIAL_IN_INTERPRETER = "from clorch.engine import in_process; in_process.allow(); from clorch.cli import main; main()"


def _start_interpreter(cores: set[int]) -> None:
    """In the trial's interpreter before it starts: its cores, and SIGTERM once the sweep (its
    parent) has gone."""
    if cores:
        os.sched_setaffinity(0, cores)
    set_parent_death_signal(signal.SIGTERM)


class _Interpreter:
    """A trial in a fresh interpreter (as `python -m clorch.cli`), where the sweep itself runs in a
    daemonic process (a multiprocessing worker's), which may start no process of its own kind."""

    def __init__(self, args: list[str], env: dict[str, str], cores: set[int], console: str | None) -> None:
        with open(console or os.devnull, "ab") as out:
            self._popen = subprocess.Popen(
                [sys.executable, "-c", _TRIAL_IN_INTERPRETER, *args],
                stdin=subprocess.DEVNULL,
                stdout=out if console else None,
                stderr=subprocess.STDOUT if console else None,
                env={**os.environ, **env},
                start_new_session=True,
                preexec_fn=functools.partial(_start_interpreter, cores),
            )
        self.pid = self._popen.pid

    @property
    def exitcode(self) -> int | None:
        return self._popen.poll()

    def join(self) -> None:
        self._popen.wait()


def _context() -> mp.context.BaseContext:
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOADED))
    return context


def start_server() -> None:
    """Start the trials' server now, so that its imports run while the sweep checks its trials.

    Returns at once: the server imports PRELOADED in a process of its own (a fresh interpreter),
    and the first trial waits for it only if it is not ready by then. It ends with this process.
    """
    _context()
    forkserver.ensure_running()


class Pool:
    """Trials in `slots`, at most one per slot; `hydra_args` go to every trial (hydra.job.*)."""

    def __init__(self, slots: list[Slot], hydra_args: list[str]) -> None:
        self.slots, self.hydra_args = slots, hydra_args
        # One trial at a time writes to the terminal, as a lone run does; side by side, each to
        # its own console.log.
        self.own_consoles = len(slots) > 1
        self.running: dict[int, Running] = {}
        self.said: set[str] = set()  # what sized_to_slot changed, said once a sweep

    def free(self) -> list[Slot]:
        busy = {r.slot.index for r in self.running.values()}
        return [s for s in self.slots if s.index not in busy]

    def start(self, number: int, overrides: list[str], run_dir: Path, env: dict[str, str]) -> Slot:
        """Start trial `number` on a free slot (there must be one); return the slot."""
        slot = self.free()[0]
        run_dir.mkdir(parents=True, exist_ok=True)
        overrides, change = sized_to_slot(overrides, slot)
        if change is not None and change not in self.said:
            self.said.add(change)
            print(f"clorch-train: {change}", flush=True)
        args = (trial_args(overrides, run_dir, self.hydra_args), {**slot.environ(), **env}, set(slot.cores))
        console = str(run_dir / CONSOLE) if self.own_consoles else None
        if mp.current_process().daemon:  # multiprocessing lets a daemonic process start none of its own
            process: Any = _Interpreter(*args, console)
        else:  # a trial starts its ranks: it is no daemon either
            process = _context().Process(target=_trial_main, args=(*args, console), daemon=False)
            process.start()
        self.running[number] = Running(number, slot, process, run_dir)
        return slot

    def wait(self) -> list[Ended]:
        """Block until at least one running trial ends; return those that did."""
        while self.running:
            ended = [self._ended(r) for r in list(self.running.values()) if r.process.exitcode is not None]
            if ended:
                return ended
            time.sleep(POLL_S)
        return []

    def _ended(self, run: Running) -> Ended:
        del self.running[run.number]
        run.process.join()
        return Ended(run.number, run.run_dir, run.process.exitcode, time.monotonic() - run.started, run.slot)

    def interrupt(self, signum: int) -> list[Ended]:
        """Pass `signum` on to every running trial, once, and wait for them all to end."""
        for run in self.running.values():
            try:
                os.kill(run.process.pid, signum)
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
