"""The best trial as a recipe: SWEEP_DIR/best.yaml, which `clorch-train +recipe=SWEEP_DIR/best.yaml` reruns.

A recipe is `# @package _global_`, its `defaults` entries (`- override /GROUP: OPTION`)
and the values that differ. best.yaml is the sweep's own recipe (`+recipe=NAME`, as this
process registered it for the sweep's command line) with the trial's overrides written
on top: the sweep's fixed overrides as typed, then the trial's value of each searched
key. A group chosen by an override (`optim=sgd`) replaces the recipe's option and the
keys the recipe gave it, as on the command line.

What a runner changed for one trial is left out: the resume of a trial that was cut off
(`checkpoint.resume=latest`), and the ranks and accumulation a side-by-side trial was
sized to (clorch.sweep.pool keeps its global batch): the sweep's typed value is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from clorch.config.composer import config_groups
from clorch.sweep.checks import grid_lines, read_sweep
from clorch.sweep.directory import BEST_FILE


def trial_overrides(sweep_overrides: list[str], trial: dict[str, str]) -> list[str] | None:
    """The overrides that rerun one trial: the sweep's fixed overrides as typed, then the
    trial's value (`trial`: {key: value}, as its .hydra/overrides.yaml holds them) of each
    searched key. None: the sweep's command line cannot be read here (clorch-train checked it)."""
    sweep, errors = read_sweep(sweep_overrides)
    if sweep is None or errors:
        return None
    if sweep.sweeper == "optuna":
        fixed, searched = list(sweep.space.fixed), [p.key for p in sweep.space.params]
    else:
        fixed, searched = [], []
        parser = OverridesParser.create()
        for line in grid_lines(sweep_overrides, sweep.settings.params):
            if line.partition("=")[0].lstrip("+~").replace("/", ".").split(".")[0] == "hydra":
                continue
            (override,) = parser.parse_overrides([line])
            if override.is_sweep_override():
                searched.append(override.key_or_group)
            else:
                fixed.append(line)
    return fixed + [f"{key}={trial[key]}" for key in searched if key in trial]


def _registered_recipe(name: str) -> dict[str, Any]:
    """The recipe `name` as clorch-train registered it for this command line (clorch.config.composer,
    in Hydra's ConfigStore: its sections for the groups the command line chooses left out)."""
    node = ConfigStore.instance().load(config_path=f"recipe/{name}.yaml").node
    return OmegaConf.to_container(node, resolve=False)  # type: ignore[return-value]


def _set(node: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value


def _delete(node: dict[str, Any], dotted: str) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        node = node.get(part) if isinstance(node.get(part), dict) else {}
    node.pop(last, None)


def recipe_of(overrides: list[str]) -> dict[str, Any]:
    """A recipe (a mapping, `defaults` first) that composes what `overrides` compose.

    Raises:
        ValueError: an override Hydra's grammar does not read, or a recipe that is not registered.
    """
    parsed = OverridesParser.create().parse_overrides(overrides)
    recipe = next((o.value() for o in parsed if o.key_or_group == "recipe"), None)
    try:
        node = _registered_recipe(str(recipe)) if recipe is not None else {}
    except Exception as exc:  # Hydra's ConfigStore: not registered in this process
        raise ValueError(f"recipe {recipe} is not registered here ({exc})") from None
    defaults = list(node.pop("defaults", None) or [])
    groups = set(config_groups())
    # Group choices first: an option replaces the recipe's section, and the values go on top of it.
    for override in sorted(parsed, key=lambda o: o.key_or_group not in groups):
        key = override.key_or_group
        if key == "recipe":
            continue
        if key in groups:  # the command line's option replaces the recipe's, and the keys it gave it
            defaults = [e for e in defaults if not (isinstance(e, dict) and _group_of(e) == key)]
            node.pop(key, None)
            defaults.append({f"override /{key}": override.value()})
        elif override.is_delete():
            _delete(node, key)
        else:
            _set(node, key, override.value())
    return {"defaults": defaults, **node} if defaults else node


def _group_of(entry: dict[str, Any]) -> str:
    return str(next(iter(entry))).replace("override", "").strip().lstrip("/")


def write_best(sweep_dir: Path, overrides: list[str], about: str) -> Path:
    """Write SWEEP_DIR/best.yaml: the recipe of `overrides`, headed by `about` and the command that runs it.

    Raises:
        ValueError: as `recipe_of`; OSError: the file cannot be written.
    """
    path = sweep_dir / BEST_FILE
    recipe = recipe_of(overrides)
    header = ["# @package _global_", f"# {about}", f"#   clorch-train +recipe={path}"]
    path.write_text("\n".join(header) + "\n" + yaml.safe_dump(recipe, sort_keys=False, default_flow_style=False))
    return path
