"""A `clorch-train` entry point for tests: the command, with a SIGINT sent to itself at a chosen
moment of its start (a Ctrl-C no test could time from outside).

`sigint_after(point, *args)` takes `tests.clirunner._main`'s arguments after `point`; bind the point
with functools.partial and pass it as `start_clorch_train(..., entry=...)`. The signal is sent
right after the function named by `point` returns:

* "checks": `clorch.cli.train._errors_before_hydra` (the config checked, no run directory yet);
* "marked": `clorch.cli.run_dir.hold` (the run directory made and marked in use, Hydra not started).

`sigint_dropped(*args)` sends it inside `clorch.engine.run.write_start` (Hydra's job, the ranks not
launched yet) and drops the `Interrupted` it raises there, wrapped in a RuntimeError, as Python 3.11
wraps one raised while a class is created and a library's `except Exception` may then drop it.
"""

from __future__ import annotations

import functools
import importlib
import os
import signal
import time
from typing import Any, Callable

from tests.clirunner import _main

POINTS = {"checks": ("clorch.cli.train", "_errors_before_hydra"), "marked": ("clorch.cli.run_dir", "hold")}


def _then_sigint(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        result = function(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)  # its handler runs before the next line of Python
        return result

    return wrapped


def sigint_after(point: str, *main_args: Any) -> None:
    module_name, name = POINTS[point]
    module = importlib.import_module(module_name)
    setattr(module, name, _then_sigint(getattr(module, name)))
    _main(*main_args)


def _sigint_dropped(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)  # the handler raises here at once (a signal cuts the sleep short)
            except KeyboardInterrupt as exc:
                raise RuntimeError("Error calling __set_name__ on 'Field' instance") from exc
        except Exception:
            pass  # a library going on past what it took for its own error
        return function(*args, **kwargs)

    return wrapped


def sigint_dropped(*main_args: Any) -> None:
    module = importlib.import_module("clorch.engine.run")
    module.write_start = _sigint_dropped(module.write_start)
    _main(*main_args)
