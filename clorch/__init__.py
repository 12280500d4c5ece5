"""clorch: a declarative, config-driven runner for data-parallel PyTorch training."""

from __future__ import annotations

from typing import Any

from clorch._version import __version__

__all__ = ["run_local", "__version__"]


def __getattr__(name: str) -> Any:
    """`clorch.run_local` is `clorch.engine.api.run_local` itself, imported on first use.

    Importing it lazily keeps `import clorch` (and clorch.nn, clorch.distributed)
    free of Hydra; handing out the function itself, not a wrapper, keeps its
    signature and docstring for help(), inspect and IDEs.
    """
    if name == "run_local":
        # lazy: clorch.engine.api imports Hydra, kept out of `import clorch` (see above)
        from clorch.engine.api import run_local

        globals()["run_local"] = run_local  # later lookups skip this hook
        return run_local
    raise AttributeError(f"module 'clorch' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
