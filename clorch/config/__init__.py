"""Config schemas, composition and validation for `clorch-train` and `clorch.run_local`."""

from __future__ import annotations

from clorch.config.compose import (
    available_recipes,
    compose,
    conf_dir,
    config_groups,
    group_options,
    recipes_dir,
    register_recipes,
)
from clorch.config.targets import allowed_prefixes, register_target_prefix, resolve_target
from clorch.config.validate import ConfigError, check_config, validate

__all__ = [
    "ConfigError", "allowed_prefixes", "available_recipes", "check_config", "compose",
    "conf_dir", "config_groups", "group_options", "recipes_dir", "register_recipes",
    "register_target_prefix", "resolve_target", "validate",
]
