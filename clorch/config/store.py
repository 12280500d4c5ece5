"""Register the schema dataclasses with Hydra's ConfigStore: they are the config groups' options.

`optim=sgd` selects `SGDConfig()`'s values, `backend=gloo` sets the top-level
`backend` key, and `clorch_top` (first in config.yaml's defaults list) holds
every top-level key's default. The nodes are plain mappings, not OmegaConf
structured configs, on purpose: a structured config stops composition at the
first wrong key or type, while clorch checks the composed config against these
same dataclasses itself and reports every error at once
(`clorch.config.checks`).
"""

from __future__ import annotations

import dataclasses

from clorch.config.schema import BACKENDS, CUSTOM, OPTIONS, TARGET_GROUPS, TopConfig

TOP_NODE = "clorch_top"


def register_groups() -> None:
    """Store every group option, the backends and the top-level defaults (idempotent)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name=TOP_NODE, node=dataclasses.asdict(TopConfig()), provider="clorch")
    for backend in BACKENDS:
        store.store(group="backend", name=backend, node={"backend": backend}, package="_global_",
                    provider="clorch")
    for group, options in OPTIONS.items():
        for name, values in options.items():
            store.store(group=group, name=name, node=dataclasses.asdict(values), provider="clorch")
    for group in TARGET_GROUPS:  # selected when a section names `_target_`: the target's keys only
        store.store(group=group, name=CUSTOM, node={"name": CUSTOM}, provider="clorch")


def group_options(group: str) -> list[str]:
    """The options of a config group (sorted)."""
    if group == "backend":
        return sorted(BACKENDS)
    return sorted([*OPTIONS[group], *([CUSTOM] if group in TARGET_GROUPS else [])])


def config_groups() -> list[str]:
    """The config groups (the `recipe` group aside)."""
    return sorted(["backend", *OPTIONS])
