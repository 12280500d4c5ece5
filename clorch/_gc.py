"""Large imports without the cyclic garbage collector rescanning them (no torch import).

Importing torch makes about a million objects (modules, functions, classes) that
live as long as the process. While they are made, the collector runs a full
collection each time the long-lived heap grew by a quarter: five or six passes
over everything imported so far, 0.3-0.8 s of a launching process's or a rank's
start on a loaded 2-core machine, and none of them frees anything. Everything
alive after the import is frozen (`gc.freeze`): later collections skip it, and
so does the one at interpreter exit.

The price: a reference cycle among the frozen objects is never collected. They
are what the imported modules hold for the process's life anyway.
"""

from __future__ import annotations

import gc
import importlib
import sys
from types import ModuleType


def import_long_lived(name: str) -> ModuleType:
    """`importlib.import_module(name)`; the first time, with the collector paused meanwhile and
    every object alive after it frozen (see the module doc).

    Nothing changes when `name` is imported already, or when the collector is off (whoever
    turned it off manages it).
    """
    if name in sys.modules or not gc.isenabled():
        return importlib.import_module(name)
    gc.disable()
    try:
        return importlib.import_module(name)
    finally:
        gc.freeze()
        gc.enable()
