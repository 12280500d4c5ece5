"""The typed config of `clorch-train` and `clorch.run_local`: schemas, composition, checks.

    schema.py     one dataclass per config group option, and TrainConfig (what the engine reads)
    store.py      the options registered with Hydra's ConfigStore
    composer.py   the configs' home (package data), recipes, composing in-process
    checks.py     every error in a composed config, at once (ConfigError)
    preflight.py  command-line overrides checked before Hydra composes
    targets.py    the `_target_` allow-list
"""

from __future__ import annotations

from clorch.config.checks import ConfigError, check_config, checked
from clorch.config.composer import (
    available_recipes,
    compose,
    config_groups,
    group_options,
    recipes_dir,
    register_recipes,
)
from clorch.config.schema import TrainConfig
from clorch.config.targets import allowed_prefixes, register_target_prefix, resolve_target

__all__ = [
    "ConfigError", "TrainConfig", "allowed_prefixes", "available_recipes", "check_config",
    "checked", "compose", "config_groups", "group_options", "recipes_dir", "register_recipes",
    "register_target_prefix", "resolve_target",
]
