"""The configs' home, the `recipe` group, and composing a config in-process.

The configs sit at the top of the repository and install as package data:
`conf/` (the primary config.yaml and one file per group option, written from
the schema dataclasses by `clorch.config.conf_files`) is the package
`clorch.conf`, which Hydra reads as `pkg://clorch.conf`; `recipes/*.yaml` is
`clorch.recipes`, read through importlib.resources, so a wheel and an editable
install (`pip install -e .`, which sees edits to them) find both. Hydra finds
`+recipe=NAME` in a config group named `recipe`: clorch registers every
shipped recipe (and those in the directories of CLORCH_RECIPE_PATH) in
Hydra's ConfigStore under that group, in the global package.
`+recipe=/a/path.yaml` registers that one file first.

A recipe's `defaults` entries are checked when it is registered: an entry
naming an unknown group or option is left out of the stored recipe and kept
as an error naming the recipe file (`recipe_errors`), so that the rest of the
config still composes and its own errors are reported too.

The command line beats a recipe: a recipe is registered without its sections for
the groups whose option the command line chooses (`rewrite_recipe_overrides`), so
that `loss=cross_entropy` replaces a recipe's `loss._target_` and its arguments.

The command line's overrides reach Hydra through `rewrite_recipe_overrides` (recipes,
shorthand, `${oc.env:...}` values, your own code's sections) and, for one run,
`hydra_overrides` (a value is set with `++`, so that an unknown key is reported with
every other error).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml
from hydra import compose as hydra_compose, initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from clorch.config import registry
from clorch.config.env_values import decodes_env, env_decoded, env_values
from clorch.config.schema import CUSTOM, SHORTHAND, TARGET_GROUPS
from clorch.config.store import config_groups, group_options as _group_options

RECIPE_PATH_VARIABLE = "CLORCH_RECIPE_PATH"
CONFIG_MODULE = "clorch.conf"
CONFIG_PATH = f"pkg://{CONFIG_MODULE}"
_recipe_errors: dict[str, list[str]] = {}  # recipe name -> errors found when registering it
_recipe_keys: dict[str, tuple[str, set[str]]] = {}  # recipe name -> (where it is, the keys it sets)
_path_recipes: dict[str, Path] = {}  # recipes registered from a file path, by their name


def recipes_dir() -> Traversable:
    """The shipped recipes (a package folder: `/ "name.yaml"` and `.read_text()` work on it)."""
    return resources.files("clorch.recipes")


def recipe_dirs() -> list[Traversable]:
    """Shipped recipes first, then CLORCH_RECIPE_PATH entries (later names win)."""
    extra = os.environ.get(RECIPE_PATH_VARIABLE, "")
    return [recipes_dir(), *(Path(p).expanduser() for p in extra.split(os.pathsep) if p)]


def _defaults_errors(where: str, defaults: Any) -> tuple[list[Any], list[str]]:
    """(the recipe's defaults entries that name a real group option, errors for the others)."""
    if defaults is None:
        return [], []
    if not isinstance(defaults, list):
        return [], [f"{where}: defaults must be a list of '- override /GROUP: OPTION' entries, got {defaults!r}"]
    kept, errors = [], []
    groups = config_groups()
    for entry in defaults:
        if entry == "_self_":
            kept.append(entry)
            continue
        if not isinstance(entry, dict) or len(entry) != 1:
            errors.append(
                f"{where}: defaults entry {entry!r} is not allowed; use "
                "'- override /GROUP: OPTION' entries and '_self_'"
            )
            continue
        ((key, option),) = entry.items()
        group = str(key).replace("override", "").strip().lstrip("/")
        if group not in groups:
            errors.append(
                f"{where}: defaults entry '{key}: {option}' names no config group; groups: {', '.join(groups)}"
            )
        elif option not in _group_options(group):
            errors.append(
                f"{where}: defaults entry '{key}: {option}': {group}={option} is not "
                f"allowed; choose one of: {', '.join(_group_options(group))}"
            )
        else:
            kept.append(entry)
    return kept, errors


def _store_recipe(name: str, path: Path | Traversable, where: str | None = None, without: Iterable[str] = ()) -> None:
    """Store recipe `name` in Hydra's ConfigStore, less its sections for the groups in `without`
    (those the command line chooses an option of: see `chosen_groups`)."""
    where = where or f"recipe {name} ({path})"
    try:
        node = _read_mapping(path.read_text())
    except Exception as exc:  # YAML syntax: name the file, keep going
        node, errors = {}, [f"{where} does not parse: {exc}".strip()]
    else:
        if not isinstance(node, dict):
            shown = repr(node) if len(repr(node)) <= 60 else repr(node)[:57] + "..."
            node, errors = (
                {},
                [
                    f"{where} is not a YAML mapping of config keys (got a "
                    f"{type(node).__name__}: {shown}); a recipe looks like 'batch_size: 32' "
                    "lines, with '- override /GROUP: OPTION' entries under 'defaults:'"
                ],
            )
        else:
            node["defaults"], errors = _defaults_errors(where, node.get("defaults"))
            _drop_groups(node, set(without))
            _recipe_keys[name] = (where, set(_dotted_keys(node)))
            _select_custom(node)
            env_values(node)
            for section, key in SHORTHAND.items():  # `preflight: only` is `preflight: {mode: only}`
                if section in node and not isinstance(node[section], dict):
                    if node[section] in _group_options(section):  # `loss: from_model` chooses that option,
                        choice = node.pop(section)  # with its own keys and defaults
                        node["defaults"].append({f"override /{section}": choice})
                    else:
                        node[section] = {key: node[section]}
            if "hydra" in node:  # a recipe is data: it must not reach Hydra's callbacks or logging
                del node["hydra"]
                errors.append(
                    f"{where} sets hydra keys, which a recipe may not (Hydra's callbacks, "
                    "logging and output directories can run code and write files): "
                    "remove them; choose the run directory with hydra.run.dir on the command line"
                )
    _recipe_errors[name] = errors
    ConfigStore.instance().store(group="recipe", name=name, node=node, package="_global_", provider="clorch")


def _drop_groups(node: dict, groups: set[str]) -> None:
    """Remove from a recipe what it sets for `groups`: their sections (`loss: {_target_: ...}`;
    `backend`, whose option sets that top-level key) and their defaults entries.

    A group option chosen on the command line replaces the recipe's option, and the keys the
    recipe gave that option go with it: the command line wins, as it does for a value.
    """
    for group in groups:
        node.pop(group, None)
    node["defaults"] = [
        entry
        for entry in node["defaults"]
        if not isinstance(entry, dict)
        or not {str(k).replace("override", "").strip().lstrip("/") for k in entry} & groups
    ]


def _select_custom(node: dict) -> None:
    """A recipe whose section names a `_target_` (`model: {_target_: my_pkg.Net, width: 64}`)
    selects that group's `custom` option, unless its defaults list chose one."""
    chosen = {
        str(k).replace("override", "").strip().lstrip("/")
        for entry in node["defaults"]
        if isinstance(entry, dict)
        for k in entry
    }
    for group in TARGET_GROUPS:
        section = node.get(group)
        if isinstance(section, dict) and "_target_" in section and group not in chosen:
            node["defaults"].insert(0, {f"override /{group}": CUSTOM})


def _read_mapping(text: str) -> Any:
    """The YAML document as plain data (an empty file is an empty mapping).

    Read with PyYAML first: OmegaConf would turn a plain line of text into a
    mapping with that line as its only key.
    """
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        return {} if data is None else data
    return OmegaConf.to_container(OmegaConf.create(text))


def _dotted_keys(node: Mapping[str, Any], prefix: str = "") -> Iterable[str]:
    """Every key a recipe sets, dotted (model.n_layer), its defaults list aside."""
    for key, value in node.items():
        if key == "defaults" and not prefix:
            continue
        if isinstance(value, Mapping) and value:
            yield from _dotted_keys(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def name_recipe_in_errors(errors: list[str], recipes: Iterable[str], overrides: Iterable[str]) -> list[str]:
    """`errors` with each one about a key that a recipe sets (and the command line does not)
    ending in where that recipe is, so that a bad value in a recipe file is found in it."""
    typed = {o.partition("=")[0].lstrip("+~") for o in overrides}
    sources = [_recipe_keys[r] for r in recipes if r in _recipe_keys]
    out = []
    for error in errors:
        key = error.split(" ", 1)[0].split("=", 1)[0].split("(", 1)[0].rstrip(":,")
        where = next((w for w, keys in sources if key in keys and key not in typed), None)
        out.append(f"{error} (set in {where})" if where and where not in error else error)
    return out


def available_recipes() -> dict[str, Path | Traversable]:
    """Recipe name -> file, over every recipe directory."""
    found: dict[str, Path | Traversable] = {}
    for directory in recipe_dirs():
        if directory.is_dir():
            for path in sorted(directory.iterdir(), key=lambda p: p.name):
                if path.name.endswith(".yaml"):
                    found[path.name[: -len(".yaml")]] = path
    return found


def recipe_errors(name: str) -> list[str]:
    """Errors found in recipe `name` when it was registered (bad defaults entries, bad YAML)."""
    return list(_recipe_errors.get(name, []))


def register_unwritten_options() -> None:
    """Store in Hydra's ConfigStore each registered option that conf/ has no file for: one
    an installed package adds (clorch.config.registry.ENTRY_POINTS), or one added to clorch
    before `python -m clorch.config.conf_files` writes its file."""
    conf = resources.files(CONFIG_MODULE)
    for group in registry.groups():
        for name, values in registry.options(group).items():
            if not (conf / group / f"{name}.yaml").is_file():
                ConfigStore.instance().store(group=group, name=name, node=dataclasses.asdict(values), provider="clorch")


def register_recipes(without: Iterable[str] = ()) -> dict[str, Path | Traversable]:
    """Register every recipe file in Hydra's ConfigStore as group `recipe` (and again each one
    registered from a path), less their sections for the groups in `without`; and the options
    conf/ has no file for (`register_unwritten_options`)."""
    register_unwritten_options()
    found = available_recipes()
    for name, path in found.items():
        _store_recipe(name, path, without=without)
    for name, path in _path_recipes.items():
        _store_recipe(name, path, where=f"recipe {path}", without=without)
    return found


def _is_path(value: str) -> bool:
    return value.endswith((".yaml", ".yml")) or os.sep in value


def register_recipe_path(value: str, without: Iterable[str] = ()) -> str:
    """Register a recipe given as a file path; return the name to select it by.

    Raises:
        ValueError: the file does not exist.
    """
    path = Path(value).expanduser().resolve()
    if not path.is_file():
        raise ValueError(f"recipe={value!r}: no such recipe file ({path})")
    name = f"file_{path.stem}"
    _store_recipe(name, path, where=f"recipe {path}", without=without)
    _path_recipes[name] = path
    return name


def recipe_file(name: str) -> Path | None:
    """The file a recipe registered from a path was read from (None for another name)."""
    return _path_recipes.get(name)


def registered_name(value: str) -> str:
    """The recipe group's option name for `value` (a name, or a file path it registers).

    Raises:
        ValueError: a recipe file path that does not exist.
    """
    return register_recipe_path(value) if _is_path(value) else value


def chosen_groups(overrides: Iterable[str]) -> set[str]:
    """The groups whose option `overrides` choose: `loss=mse` (a sweep's `loss=mse,cross_entropy`
    too), or `loss._target_=...`, which chooses `custom` (`CustomSections`)."""
    groups = set(config_groups())
    chosen = set()
    for item in overrides:
        key = _key(item)
        if item.startswith("~") or "=" not in item:
            continue
        if key in groups or (key.endswith("._target_") and key.split(".")[0] in TARGET_GROUPS and key.count(".") == 1):
            chosen.add(key.split(".")[0])
    return chosen


def rewrite_recipe_overrides(overrides: Iterable[str]) -> list[str]:
    """The command line's overrides as Hydra is to compose them: each through the rewrites
    that apply to it, in this order, and the recipes registered.

    1. A section's one key given as its value: `preflight=only` is `preflight.mode=only`
       (clorch.config.schema.SHORTHAND); a choice of the group's options stays as it is.
    2. A recipe file: `+recipe=/a/file.yaml` is `+recipe=<the name it is registered by>`.
    3. `KEY=${oc.env:NAME,default}` is read as the key's type (clorch.config.env_values).
    4. `GROUP._target_=...` chooses its group's `custom` option (`CustomSections`).

    The recipes are registered without their sections for the groups whose option the
    command line chooses (`chosen_groups`): the command line beats the recipe, and the
    recipe beats the defaults, for a group's option as for a value. An override that no
    rewrite applies to reaches Hydra as typed.
    """
    overrides = [_shorthand(o) if _is_shorthand(o) else o for o in overrides]
    without = chosen_groups(overrides)
    register_recipes(without)
    overrides = [_registered_recipe(o, without) if _names_recipe_file(o) else o for o in overrides]
    custom = CustomSections.of(overrides)
    rewritten = [f"{group}={CUSTOM}" for group in custom.added]
    for item in overrides:
        if custom.drops(item):
            continue
        item = env_decoded(item) if decodes_env(item) else item
        rewritten.append(custom.added_key(item) if custom.adds(item) else item)
    return rewritten


def hydra_overrides(args: Iterable[str]) -> list[str]:
    """The overrides of one run as Hydra should see them: values forced (`++key=value`).

    Hydra's own keys (hydra.*), group choices, `+`/`++` additions and deletions pass
    unchanged; `key=value` becomes `++key=value` so that an unknown key is composed and
    then reported by the schema check with every other error.
    """
    groups = set(config_groups()) | {"recipe"}
    out = []
    for arg in args:
        key, sep, _ = arg.partition("=")
        plain = sep and not arg.startswith(("+", "~"))
        if plain and key not in groups and key.split(".")[0] != "hydra" and "/" not in key:
            arg = f"++{arg}"
        out.append(arg)
    return out


def _is_shorthand(override: str) -> bool:
    key, sep, value = override.partition("=")
    section = key.lstrip("+")
    return bool(
        sep
        and section in SHORTHAND
        and not key.startswith("~")
        and not set(value.split(",")) <= set(_group_options(section))
    )


def _shorthand(override: str) -> str:
    """`preflight=only` as `preflight.mode=only` (see `_is_shorthand`)."""
    key, _, value = override.partition("=")
    return f"{key}.{SHORTHAND[key.lstrip('+')]}={value}"


def _names_recipe_file(override: str) -> bool:
    key, sep, value = override.partition("=")
    return bool(sep) and key.lstrip("+~") == "recipe" and _is_path(value)


def _registered_recipe(override: str, without: Iterable[str]) -> str:
    """`+recipe=/a/file.yaml` as `+recipe=<registered name>`, registering the file.

    Raises:
        ValueError: the file does not exist.
    """
    key, _, value = override.partition("=")
    return f"{key}={register_recipe_path(value, without)}"


def _key(override: str) -> str:
    return override.partition("=")[0].lstrip("+~")


@dataclass(frozen=True)
class CustomSections:
    """What naming your own code (`GROUP._target_=...`) on the command line, or in a recipe,
    changes in the overrides, so that `model._target_=my_pkg.Net model.width=64` composes a
    model section of just those keys: the built-in option's keys (hidden_features, ...) are
    not carried along, nor a recipe's model keys (`rewrite_recipe_overrides` registers it
    without them).

    added: the groups whose `GROUP=custom` is added (a `_target_` given, no option chosen).
    keyed: the groups whose keys are added to their custom section (`++GROUP.KEY=V`: the
        custom option has no keys of its own).
    pruned: the groups whose `~GROUP.KEY` deletions of keys the custom section does not
        have are dropped.
    given: the keys the overrides set.
    """

    added: tuple[str, ...] = ()
    keyed: frozenset[str] = frozenset()
    pruned: frozenset[str] = frozenset()
    given: frozenset[str] = frozenset()

    @classmethod
    def of(cls, overrides: list[str]) -> "CustomSections":
        added, keyed, pruned = [], set(), set()
        for group in TARGET_GROUPS:
            chosen = any(_key(o) == group for o in overrides)
            if not any(_key(o) == f"{group}._target_" and not o.startswith("~") for o in overrides):
                if _recipe_names_target(overrides, group) and not chosen:
                    keyed.add(group)  # the recipe's custom section takes the keys given
                continue
            if not chosen:
                added.insert(0, group)
            if not chosen or any(_key(o) == group and o.partition("=")[2] == CUSTOM for o in overrides):
                keyed.add(group)
                pruned.add(group)
        given = {_key(o) for o in overrides if not o.startswith("~")} | set(added)
        return cls(tuple(added), frozenset(keyed), frozenset(pruned), frozenset(given))

    def drops(self, override: str) -> bool:
        """Whether `override` deletes a key that a custom section does not have."""
        key = _key(override)
        return override.startswith("~") and key not in self.given and _group_of(key) in self.pruned

    def adds(self, override: str) -> bool:
        """Whether `override` sets a key of a custom section (`added_key` writes it)."""
        return not override.startswith(("~", "-")) and _group_of(_key(override)) in self.keyed

    @staticmethod
    def added_key(override: str) -> str:
        """`GROUP.KEY=V` as `++GROUP.KEY=V`."""
        return f"++{override.lstrip('+')}"


def _group_of(key: str) -> str | None:
    """The group a dotted key is in (`model.width` is in `model`), or None for a group's own key."""
    group, dot, _ = key.partition(".")
    return group if dot else None


def _recipe_names_target(overrides: list[str], group: str) -> bool:
    """Whether a recipe the overrides choose names `GROUP._target_`."""
    names = (o.partition("=")[2] for o in overrides if _key(o) == "recipe" and not o.startswith("~"))
    return any(f"{group}._target_" in _recipe_keys.get(name, ("", set()))[1] for name in names)


def group_options(group: str) -> list[str]:
    """The options of a config group (or the recipe names)."""
    if group == "recipe":
        return sorted({**available_recipes(), **_path_recipes})
    return _group_options(group)


def format_value(value: Any) -> str:
    """A Python value in Hydra's override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{format_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if text and all(c.isalnum() or c in "_-./:" for c in text) and not text[0].isdigit():
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def compose(overrides: Iterable[str] = ()) -> DictConfig:
    """Compose the config as `clorch-train OVERRIDES...` would, in this process.

    Raises:
        ValueError: a recipe file that does not exist.
        hydra.errors.HydraException: an unknown group option or key (Hydra's message).
    """
    overrides = rewrite_recipe_overrides(overrides)
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module=CONFIG_MODULE, version_base=None):
        return hydra_compose(config_name="config", overrides=overrides)
