"""The typed config of `clorch-train` and `clorch.run_local`: schemas, composition, the launch plan.

schema.py           one dataclass per config group option, and TrainConfig (what the engine reads)
source_defaults.py  defaults read from the classes' source (no torch import)
conf_files.py       conf/'s YAML files, written from the schemas
store.py            the config groups and their options
composer.py         the configs' home (package data), recipes, composing in-process
overrides.py        command-line overrides checked before Hydra composes (every sweep combination)
checks.py           every error in a composed config, at once (ConfigError)
fields.py           one section's keys, types and ranges
targets.py          the `_target_` allow-list
plan.py             the front door: a composed config becomes the launch plan, once per run
plan_checks.py      the plan's checks of this machine, the data's sizes and the filesystem
model_spec.py       the model a config names, and the data sizes it gets
paths.py            relative paths made absolute against where the user ran from
resume.py           does the checkpoint to resume fit this run"""

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
