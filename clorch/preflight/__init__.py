"""Preflight: checks of the job's machines, run inside its own ranks before training.

Each rank checks itself (device, versions, memory, GEMM speed, checkpoint
directory) and the ranks check each other (arrival, all-reduce bus bandwidth,
the nodes' leaders, a neighbour round trip), every wait with a deadline; the
verdict names the rank and host that is wrong.

    options.py  PreflightConfig: the typed options and their check (no torch)
    local.py    a rank's own checks
    group.py    the checks between ranks (collectives with deadlines)
    meeting.py  meetings in the rendezvous store that name missing ranks
    timing.py   the timed GEMM, write and waits
    report.py   the verdict: comparisons, failure lines, table, PreflightResult
    run.py      run_preflight, which every rank calls
"""

from __future__ import annotations

import importlib
from typing import Any

from clorch.preflight.options import PreflightConfig, normalize_mode

# Imported on first use: the config code imports PreflightConfig from here to
# check a config, and that must not import torch (composing stays fast, and
# works where torch is not importable).
_LAZY = {
    "run_preflight": "clorch.preflight.run",
    "PreflightResult": "clorch.preflight.report",
    "format_report": "clorch.preflight.report",
}


def __getattr__(name: str) -> Any:
    """Import a name of `_LAZY` from its module on first access."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'clorch.preflight' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = ["PreflightConfig", "normalize_mode", *_LAZY]
