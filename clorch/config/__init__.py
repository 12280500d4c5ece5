"""The typed config of `clorch-train` and `clorch.run_local`: what describes and checks a config.

No torch and no builders here (`tests/test_layers.py`): turning a checked config and
the machine into a launch plan is clorch.plan's work, one floor up.

registry.py         the config groups and their options: everything about an option is found there
options/            the options, one module per group: keys, defaults, rules across keys
schema.py           the top-level keys and TrainConfig, one option per group (what the engine reads)
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

import importlib
from typing import Any

# Where each public name lives. Imported on first use, so that `import clorch.config.registry`
# (read by clorch-runs and the printed commands) does not import Hydra.
_NAMES = {
    "ConfigError": "clorch.config.checks",
    "check_config": "clorch.config.checks",
    "checked": "clorch.config.checks",
    "available_recipes": "clorch.config.composer",
    "compose": "clorch.config.composer",
    "config_groups": "clorch.config.composer",
    "group_options": "clorch.config.composer",
    "recipes_dir": "clorch.config.composer",
    "register_recipes": "clorch.config.composer",
    "TrainConfig": "clorch.config.schema",
    "allowed_prefixes": "clorch.config.targets",
    "register_target_prefix": "clorch.config.targets",
    "resolve_target": "clorch.config.targets",
}
__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module 'clorch.config' has no attribute {name!r}")
    value = getattr(importlib.import_module(_NAMES[name]), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
