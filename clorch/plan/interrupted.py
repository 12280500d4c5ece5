"""An interrupt is never a config error: the checks before launch let it through.

The checks run code that is not the config's (your dataset, your model's factory and forward,
torch's first import) and report what it raises as a config error (exit 2), with `except
Exception`. Ctrl-C, SIGTERM and SIGHUP raise a KeyboardInterrupt (clorch.engine.interrupts),
which passes such a handler; but Python 3.11 wraps one raised while a class is created (a
module being imported) in a RuntimeError, and a library may raise its own error while one
passes. `reraise_interrupt` raises the interrupt behind such an error again, so the run ends as
interrupted (128 + the signal) rather than as a config error.

Standard library only: the engine (which owns the signals) sits above the plan.
"""

from __future__ import annotations


def interrupt_behind(exc: BaseException | None, kind: type[BaseException] = KeyboardInterrupt) -> BaseException | None:
    """The `kind` (a KeyboardInterrupt) `exc` is, was raised from, or was raised while handling; None if none."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kind):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def reraise_interrupt(exc: BaseException) -> None:
    """Raise the KeyboardInterrupt behind `exc` (`interrupt_behind`) again, if any; else return.

    Call it first in an `except Exception` block that turns what it caught into an error message.
    """
    behind = interrupt_behind(exc)
    if behind is not None:
        raise behind
