"""clorch's sweepers, as Hydra finds its plugins (the `hydra_plugins` namespace package).

`hydra/sweeper=basic` (clorch-train's default) and `hydra/sweeper=optuna` name
these classes in clorch's conf/hydra/sweeper/*.yaml; what they do is in
clorch.sweep (imported when a sweep starts, so that Hydra's plugin scan at every
start of clorch-train imports neither torch nor Optuna).
"""

from __future__ import annotations

from typing import Any, List

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class _ClorchSweeper(Sweeper):
    """Reads its settings from the command line (clorch.sweep.checks), as clorch-train checked them."""

    def __init__(self, **settings: Any) -> None:
        self.settings = settings  # the composed keys; the command line's are read in run_sweep
        self.config: DictConfig | None = None
        self.launcher: Any = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: List[str]) -> Any:
        from clorch.sweep.run import run_sweep  # lazy: torch and Optuna only once a sweep runs

        return run_sweep(self.config, self.launcher, list(arguments))


class GridSweeper(_ClorchSweeper):
    """hydra/sweeper=basic: Hydra's grid (every combination of `a,b,c` lists), n_jobs at a time."""


class OptunaSweeper(_ClorchSweeper):
    """hydra/sweeper=optuna: Optuna's search over Hydra's sweep grammar, with pruning."""
