"""Ctrl-C, SIGTERM and SIGHUP end a run cleanly: ranks stopped, summary.json written, a resume hint.

`clorch-train` runs inside `interrupts_raise()` from its start (see
clorch.cli.train.train_main; one rank of an outside launcher's job only while it
trains, clorch.engine.as_rank): the first of these signals
raises `Interrupted` in the main thread (after clorch's launcher has forwarded
it to the ranks, see clorch.launch.signals); the engine stops the job, waits
for the ranks, and records the run as "interrupted". Later signals while it
does so are noted and do not interrupt the cleanup (the launcher still
forwards them, and SIGKILL follows its grace period). What must still be
written when a run ends that way (a sweep's summary) is registered with
`at_interrupt`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import yaml

from clorch._checkpoint_names import any_step_checkpoints
from clorch._commands import TRUST_VARIABLE, pasteable
from clorch.config.composer import recipe_file
from clorch.plan.interrupted import interrupt_behind

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Overrides a resumed run must not repeat: it names its directory and resumes from latest.
_REPLACED = ("hydra.run.dir", "checkpoint.resume", "checkpoint.dir")
MULTIRUN = ("-m", "--multirun")  # a sweep (as clorch.cli.hydra_flags, which is above the engine)


class Interrupted(KeyboardInterrupt):
    """A run was interrupted by a signal (a KeyboardInterrupt, so `except Exception` lets it pass)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.signal_name = signal.Signals(signum).name
        super().__init__(f"interrupted by {self.signal_name}")


_at_interrupt: list[Callable[[Interrupted], None]] = []
# The signals noted by the outermost `interrupts_raise` block open in the main thread (a block
# within it notes into the same list), or None when none is open.
_open_block: list[list[int] | None] = [None]


def at_interrupt(action: Callable[[Interrupted], None]) -> Callable[[], None]:
    """Call `action(exc)` when the next `Interrupted` leaves `interrupts_raise()`'s block, before
    it goes on (once: the interrupt ends the work the action belongs to); return the function
    that cancels it.

    For what must still be written when a signal ends the process's work (a sweep's
    summary): the signal may arrive anywhere, also inside code that has no cleanup
    of its own for it (Hydra's sweep loop). Later signals do not cut `action` short.
    """
    _at_interrupt.append(action)
    return lambda: _at_interrupt.remove(action) if action in _at_interrupt else None


def _run_at_interrupt(exc: Interrupted) -> None:
    actions, _at_interrupt[:] = list(_at_interrupt), []
    for action in actions:
        try:
            action(exc)
        except Exception as error:  # the interrupt's own exit status and message come first
            print(f"clorch-train: while ending the interrupted run: {type(error).__name__}: {error}", file=sys.stderr)


@contextlib.contextmanager
def interrupts_raise() -> Iterator[None]:
    """Within: the first SIGINT, SIGTERM or SIGHUP raises `Interrupted`; later ones are noted only
    (and ignored after the block, once one has fired). An `Interrupted` leaving the block
    (raised by the handler, or by the code within) first runs the `at_interrupt` actions.

    An error that an `Interrupted` caused (see `_interrupt_behind`) leaves the block as that
    interrupt. A block within another keeps the outer block's handlers (one first signal for both), so
    that clorch-train's block around the whole command leaves no moment where a run's own
    block has restored Python's default (a KeyboardInterrupt traceback).

    Only the main thread can install handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outer = _open_block[0]
    if outer is not None:  # within another block (clorch-train's own, around a run's): its handlers stay
        with _noting(outer):
            yield
        return
    fired: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if fired:
            return  # already ending the run: let it finish writing its outputs
        fired.append(signum)
        raise Interrupted(signum)

    previous = {signum: signal.getsignal(signum) for signum in HANDLED}
    _open_block[0] = fired
    try:
        # Inside the try: a signal as soon as the first handler is set still restores them all.
        for signum in HANDLED:
            signal.signal(signum, handler)
        with _noting(fired):
            yield
    finally:
        _open_block[0] = None
        for signum, old in previous.items():
            # After an interrupt the process is on its way out: a late second signal must not
            # turn the clean end into a traceback.
            signal.signal(signum, signal.SIG_IGN if fired else old)


def raise_if_signalled() -> None:
    """Raise `Interrupted` again if a signal has already fired in the open `interrupts_raise()` block.

    Called where only a run still going goes on (before launching ranks, while waiting for
    them): the first signal's `Interrupted` can be dropped on its way up, e.g. Python 3.11
    wraps one raised while a class is created (a module being imported) in a RuntimeError,
    which a library's `except Exception` may catch and go past. Later signals are only
    noted, so without this such a run would train to its end, stoppable by SIGKILL alone.
    Outside any block (clorch.engine.api, a test) this does nothing.
    """
    fired = _open_block[0]
    if fired:
        raise Interrupted(fired[0])


@contextlib.contextmanager
def _noting(fired: list[int]) -> Iterator[None]:
    """An `Interrupted` leaving the block is noted in `fired` and runs the `at_interrupt` actions;
    so does an error it caused, which leaves as the interrupt."""
    try:
        yield
    except Interrupted as exc:
        fired.append(exc.signum)  # raised by the code within: later signals are noted only, too
        _run_at_interrupt(exc)
        raise
    except Exception as exc:
        cause = _interrupt_behind(exc)
        if cause is None:
            raise
        fired.append(cause.signum)
        _run_at_interrupt(cause)
        raise Interrupted(cause.signum) from exc


def _interrupt_behind(exc: BaseException) -> Interrupted | None:
    """The `Interrupted` that `exc` was raised from or while handling, if any.

    The handler raises wherever the main thread is, and some places turn what is raised
    there into another error: Python 3.11 wraps it in a RuntimeError when it lands in a
    class's creation (a module being imported), and cleanup code may fail while it passes.
    """
    return interrupt_behind(exc, Interrupted)


def resume_hint(cfg: Any, run_dir: Path, argv: Sequence[str], base: str | None = None) -> str:
    """One sentence: the command that resumes the interrupted run, or why there is none.

    The command works pasted anywhere (clorch._commands.pasteable): it goes on in the same
    run directory (`hydra.run.dir`, on every node its own) from the latest checkpoint in
    its checkpoint directory, with the trust variable this run was started with.

    Args:
        cfg: the run's config (a TrainConfig).
        run_dir: the run's directory.
        argv: clorch-train's arguments as typed (a sweep's: its job's own overrides are read
            from the run directory's .hydra/overrides.yaml instead).
        base: the directory clorch-train was started from (default: the working directory).
    """
    if cfg.checkpoint.policy != "periodic":
        return (
            f"checkpoint.policy is {cfg.checkpoint.policy}, so no checkpoint was written: "
            "a new run starts from the beginning"
        )
    base = os.getcwd() if base is None else base
    run_dir = Path(base, run_dir).resolve()
    directory, found = _step_checkpoints(cfg, run_dir, base)
    if not found:
        return f"no checkpoint was written yet in {directory}: a new run starts from the beginning"
    args = _job_args(argv, run_dir)
    kept = [a for a in args if a.partition("=")[0].lstrip("+~") not in _REPLACED]
    command = pasteable(
        [*kept, f"hydra.run.dir={run_dir}", f"checkpoint.dir={directory}", "checkpoint.resume=latest"],
        base,
        os.environ.get(TRUST_VARIABLE),
        cd=False,
    )
    return f"the latest checkpoint is step {found[0][0]}; resume with: {command}"


def _step_checkpoints(cfg: Any, run_dir: Path, base: str) -> tuple[Path, list[tuple[int, Path]]]:
    """The run's checkpoint directory (absolute) and its step checkpoints, newest first."""
    # lazy: clorch.train.checkpoints imports torch, kept out of clorch-train's start
    from clorch.train.checkpoints import checkpoint_dir

    directory = Path(base, checkpoint_dir(cfg, Path(base, run_dir).resolve())).resolve()
    return directory, any_step_checkpoints(directory)


def step_reached(cfg: Any, run_dir: Path, logged: int, base: str | None = None) -> int:
    """The step an interrupted run had reached, as far as its files tell: its last logged step
    (`logged`) or its newest step checkpoint, whichever is later (the ranks stopped by the
    signal report nothing, and a checkpoint may come between two logged steps)."""
    if cfg.checkpoint.policy != "periodic":
        return logged
    _, found = _step_checkpoints(cfg, run_dir, os.getcwd() if base is None else base)
    return max(logged, found[0][0]) if found else logged


def _job_args(argv: Sequence[str], run_dir: Path) -> list[str]:
    """The overrides of this run alone: `argv` less its flags; a sweep's job's own combination
    (Hydra's record of it, recipe files given by their paths again)."""
    if not any(a in MULTIRUN for a in argv):
        return [a for a in argv if not a.startswith("-")]
    try:
        recorded = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
    except (OSError, yaml.YAMLError):
        recorded = None
    if not isinstance(recorded, list):
        return [a for a in argv if not a.startswith("-")]
    return [_recipe_as_typed(str(a)) for a in recorded]


def _recipe_as_typed(override: str) -> str:
    """`+recipe=file_NAME` (how clorch-train registers a recipe file) as the file's path again."""
    key, _, value = override.partition("=")
    path = recipe_file(value) if key.lstrip("+") == "recipe" else None
    return f"{key}={path}" if path is not None else override
