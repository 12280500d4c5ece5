"""clorch: a declarative, config-driven runner for data-parallel PyTorch training."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def run_local(*args: Any, **kwargs: Any) -> dict:
    """Compose a recipe, launch it on this machine, wait, and return status and logs.

    See `clorch.engine.run_local`.
    """
    from clorch.engine.api import run_local as _run_local

    return _run_local(*args, **kwargs)
