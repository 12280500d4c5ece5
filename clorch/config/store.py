"""The config groups and their options, as the schema dataclasses define them.

Hydra composes the YAML files of conf/ (`conf/optim/sgd.yaml` is `optim=sgd`),
which `clorch.config.conf_files` writes from these same dataclasses; the names
listed here are what clorch offers, checks and prints in its errors.
"""

from __future__ import annotations

from clorch.config import registry
from clorch.config.schema import BACKENDS, CUSTOM, TARGET_GROUPS


def group_options(group: str) -> list[str]:
    """The options of a config group (sorted; `custom`, your own code, last)."""
    if group == "backend":
        return sorted(BACKENDS)
    return [*sorted(registry.options(group)), *([CUSTOM] if group in TARGET_GROUPS else [])]


def config_groups() -> list[str]:
    """The config groups (the `recipe` group aside)."""
    return sorted(["backend", *registry.groups()])
