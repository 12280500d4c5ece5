"""Where the configs live, the `recipe` group, and composing a config in-process.

`conf/` (the primary config and one folder per group) and `recipes/` sit at
the top of a source checkout; an installed wheel puts them under
`<prefix>/share/clorch/` (pyproject.toml's data-files). Hydra finds `+recipe=NAME` in a config
group named `recipe`: clorch registers every `recipes/*.yaml` file (and those
in the directories of CLORCH_RECIPE_PATH) in Hydra's ConfigStore under that
group, in the global package, so that the recipe folder keeps its place and
name. `+recipe=/a/path.yaml` registers that one file first.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path
from typing import Any, Iterable, Mapping

from omegaconf import DictConfig, OmegaConf

RECIPE_PATH_VARIABLE = "CLORCH_RECIPE_PATH"
_PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def _data_dir(name: str, marker: str) -> Path:
    """`name` (conf or recipes) of a source checkout, else of the installed data files.

    A checkout (editable install) has pyproject.toml beside the package; a
    wheel installs the folders under <scheme data>/share/clorch/ (the venv or
    prefix, or the user base for `pip install --user`).
    """
    checkout = _PACKAGE_ROOT.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / name / marker).exists():
        return checkout / name
    roots = [sysconfig.get_path("data"), sys.prefix]
    try:
        roots.append(sysconfig.get_path("data", f"{os.name}_user"))
    except KeyError:
        pass
    for root in roots:
        candidate = Path(root) / "share" / "clorch" / name
        if (candidate / marker).exists():
            return candidate
    raise FileNotFoundError(f"clorch's {name}/ folder was not found beside the package "
                            f"({checkout}) or under <prefix>/share/clorch: reinstall clorch")


def conf_dir() -> Path:
    """The directory holding config.yaml and the config groups."""
    return _data_dir("conf", "config.yaml")


def recipes_dir() -> Path:
    """The directory of the shipped recipes."""
    return _data_dir("recipes", "ddp_bf16.yaml")


def recipe_dirs() -> list[Path]:
    """Shipped recipes first, then CLORCH_RECIPE_PATH entries (later names win)."""
    extra = os.environ.get(RECIPE_PATH_VARIABLE, "")
    return [recipes_dir(), *(Path(p).expanduser() for p in extra.split(os.pathsep) if p)]


def _store_recipe(name: str, path: Path) -> None:
    from hydra.core.config_store import ConfigStore

    node = OmegaConf.load(path)
    ConfigStore.instance().store(group="recipe", name=name, node=node, package="_global_",
                                 provider="clorch")


def available_recipes() -> dict[str, Path]:
    """Recipe name -> file, over every recipe directory."""
    found: dict[str, Path] = {}
    for directory in recipe_dirs():
        if directory.is_dir():
            for path in sorted(directory.glob("*.yaml")):
                found[path.stem] = path
    return found


def register_recipes() -> dict[str, Path]:
    """Register every recipe file in Hydra's ConfigStore as group `recipe`."""
    found = available_recipes()
    for name, path in found.items():
        _store_recipe(name, path)
    return found


def _is_path(value: str) -> bool:
    return value.endswith((".yaml", ".yml")) or os.sep in value


_path_recipes: dict[str, Path] = {}  # recipes registered from a file path, by their name


def register_recipe_path(value: str) -> str:
    """Register a recipe given as a file path; return the name to select it by.

    Raises:
        ValueError: the file does not exist.
    """
    path = Path(value).expanduser().resolve()
    if not path.is_file():
        raise ValueError(f"recipe={value!r}: no such recipe file ({path})")
    name = f"file_{path.stem}"
    _store_recipe(name, path)
    _path_recipes[name] = path
    return name


def rewrite_recipe_overrides(overrides: Iterable[str]) -> list[str]:
    """Register recipes, and turn `+recipe=/a/file.yaml` into `+recipe=<registered name>`."""
    register_recipes()
    rewritten = []
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep and key.lstrip("+~") == "recipe" and _is_path(value):
            item = f"{key}={register_recipe_path(value)}"
        rewritten.append(item)
    return rewritten


def group_options(group: str) -> list[str]:
    """The options of a config group under conf/ (or the recipe names)."""
    if group == "recipe":
        return sorted({**available_recipes(), **_path_recipes})
    directory = conf_dir() / group
    return sorted(p.stem for p in directory.glob("*.yaml")) if directory.is_dir() else []


def config_groups() -> list[str]:
    """The config groups under conf/."""
    return sorted(p.name for p in conf_dir().iterdir() if p.is_dir())


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
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = rewrite_recipe_overrides(overrides)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return hydra_compose(config_name="config", overrides=overrides)
