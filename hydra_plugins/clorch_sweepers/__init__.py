"""clorch's sweepers, as Hydra finds its plugins (the `hydra_plugins` namespace package).

`hydra/sweeper=basic` (clorch-train's default) and `hydra/sweeper=optuna` name
these classes in clorch's conf/hydra/sweeper/*.yaml; what they do is in
clorch.sweep (imported when a sweep starts, so that Hydra's plugin scan at every
start of clorch-train imports neither torch nor Optuna).

Hydra finds plugins by walking the `hydra_plugins` folders on `sys.path`. An
editable install by setuptools' default (`pip install -e .`) puts no folder of
clorch's there, only an import hook that Hydra's walk does not see, so
`clorch-train` registers these classes itself before Hydra starts
(`register_sweepers`): any install finds them.
"""

from __future__ import annotations

from typing import Any, List

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from clorch.sweep.settings import GridSettings, OptunaSettings, from_mapping


class _ClorchSweeper(Sweeper):
    """A clorch sweeper: the keys Hydra composed for it (`hydra.sweeper.*`), typed, and its launcher."""

    SETTINGS: type = GridSettings

    def __init__(self, **composed: Any) -> None:
        # Hydra composed these from conf/hydra/sweeper/*.yaml and the command line; clorch-train
        # checked the same keys (clorch.sweep.checks) before Hydra started, so unknown keys were
        # refused there and are left out here.
        self.settings: GridSettings | OptunaSettings = from_mapping(self.SETTINGS, composed)[0]
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

    SETTINGS = GridSettings


class OptunaSweeper(_ClorchSweeper):
    """hydra/sweeper=optuna: Optuna's search over Hydra's sweep grammar, with pruning."""

    SETTINGS = OptunaSettings


def register_sweepers() -> None:
    """Register clorch's sweepers with Hydra's plugin registry (Hydra's public
    `Plugins.register`), as its scan of `hydra_plugins` would have: call it before Hydra
    instantiates a sweeper. Registering twice is harmless."""
    plugins = Plugins.instance()
    for sweeper in (GridSweeper, OptunaSweeper):
        plugins.register(sweeper)
