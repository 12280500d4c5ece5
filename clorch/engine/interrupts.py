"""Ctrl-C, SIGTERM and SIGHUP end a run cleanly: ranks stopped, summary.json written, a resume hint.

`clorch-train` runs inside `interrupts_raise()`: the first of these signals
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
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from clorch._checkpoint_names import step_checkpoints

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Overrides a resumed run must not repeat: it chooses its own directory and resumes from latest.
_REPLACED = ("hydra.run.dir", "checkpoint.resume", "checkpoint.dir")


class Interrupted(KeyboardInterrupt):
    """A run was interrupted by a signal (a KeyboardInterrupt, so `except Exception` lets it pass)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.signal_name = signal.Signals(signum).name
        super().__init__(f"interrupted by {self.signal_name}")


_at_interrupt: list[Callable[[Interrupted], None]] = []


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
            print(f"clorch-train: while ending the interrupted run: {type(error).__name__}: {error}",
                  file=sys.stderr)


@contextlib.contextmanager
def interrupts_raise() -> Iterator[None]:
    """Within: the first SIGINT, SIGTERM or SIGHUP raises `Interrupted`; later ones are noted only
    (and ignored after the block, once one has fired). An `Interrupted` leaving the block
    (raised by the handler, or by the code within) first runs the `at_interrupt` actions.

    Only the main thread can install handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if fired:
            return  # already ending the run: let it finish writing its outputs
        fired.append(signum)
        raise Interrupted(signum)

    previous = {signum: signal.signal(signum, handler) for signum in HANDLED}
    try:
        yield
    except Interrupted as exc:
        fired.append(exc.signum)  # raised by the code within: later signals are noted only, too
        _run_at_interrupt(exc)
        raise
    finally:
        for signum, old in previous.items():
            # After an interrupt the process is on its way out: a late second signal must not
            # turn the clean end into a traceback.
            signal.signal(signum, signal.SIG_IGN if fired else old)


def resume_hint(cfg: Any, run_dir: Path, argv: Sequence[str]) -> str:
    """One sentence: the command that resumes the interrupted run, or why there is none."""
    # lazy: clorch.engine.checkpoints imports torch, kept out of clorch-train's start
    from clorch.engine.checkpoints import checkpoint_dir

    if cfg.checkpoint.policy != "periodic":
        return (f"checkpoint.policy is {cfg.checkpoint.policy}, so no checkpoint was written: "
                "a new run starts from the beginning")
    directory = checkpoint_dir(cfg, run_dir).resolve()
    found = step_checkpoints(directory)
    if not found:
        return f"no checkpoint was written yet in {directory}: a new run starts from the beginning"
    kept = [a for a in argv if a.partition("=")[0].lstrip("+~") not in _REPLACED]
    command = shlex.join(["clorch-train", *kept, f"checkpoint.dir={directory}", "checkpoint.resume=latest"])
    return f"the latest checkpoint is step {found[0][0]}; resume with: {command}"
