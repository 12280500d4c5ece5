"""The typed config of `clorch-train` and `clorch.run_local`: what describes and checks a config.

No torch and no builders here (`tests/test_layers.py`): turning a checked config and
the machine into a launch plan is clorch.plan's work, one floor up.

schema.py           one dataclass per config group option, and TrainConfig (what the engine reads)
source_defaults.py  defaults read from the classes' source (no torch import)
conf_files.py       conf/'s YAML files, written from the schemas
store.py            the config groups and their options
composer.py         the configs' home (package data), recipes, composing in-process
overrides.py        command-line overrides checked before Hydra composes (every sweep combination)
checks.py           every error in a composed config, at once (ConfigError)
fields.py           one section's keys, types and ranges
targets.py          the `_target_` allow-list
paths.py            relative paths made absolute against where the user ran from"""

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
    "ConfigError",
    "TrainConfig",
    "allowed_prefixes",
    "available_recipes",
    "check_config",
    "checked",
    "compose",
    "config_groups",
    "group_options",
    "recipes_dir",
    "register_recipes",
    "register_target_prefix",
    "resolve_target",
]
