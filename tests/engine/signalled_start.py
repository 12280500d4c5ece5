"""A `clorch-train` entry point for tests: the command, with a SIGINT sent to itself at a chosen
moment of its start (a Ctrl-C no test could time from outside).

`sigint_after(point, *args)` takes `tests.clirunner._main`'s arguments after `point`; bind the point
with functools.partial and pass it as `start_clorch_train(..., entry=...)`. The signal is sent
right after the function named by `point` returns:

* "checks": `clorch.cli.train._errors_before_hydra` (the config checked, no run directory yet);
* "marked": `clorch.cli.run_dir.hold` (the run directory made and marked in use, Hydra not started).
"""

from __future__ import annotations

import functools
import importlib
import os
import signal
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
