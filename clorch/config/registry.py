"""The config groups and the options that join them: where everything about an option is found.

An option is one dataclass in a module of `clorch.config.options`, registered with
`@option(group, name)`. The class carries all there is to know about it:

- its keys: the dataclass fields, with their defaults, `Literal` choices and `rule(...)`
  metadata (ranges, units, `path=True` for a file or directory the run reads or writes);
  the comment beside a field is its documentation (conf/ YAML, docs/keys.md);
- its rules across keys: `rules(self, cfg)` returns the errors that involve other sections
  (`cfg` is the whole typed config, or a `Partial` whose bad sections are None);
- what builds it, where a clorch class does: a `"module:name"` string (`task` for a data
  task), imported by clorch.plan or the engine, never here;
- what it gives the model (a data option's `model`, the built-in model it trains).

Everything else is derived from the registry: `TrainConfig.from_dict`, the checks, the
generated conf/ files and docs/keys.md, `clorch-train --help`'s groups, the path keys made
absolute, the override hints. Every module in `clorch.config.options` is imported when the
registry is first read, so a new option is one new file there (see docs/extending.md); an
installed package adds its own through the `clorch.options` entry-point group.

Torch-free and Hydra-free: `clorch-train --help` and `clorch-runs` read it.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Callable, TypeVar

from clorch.config.source_defaults import source_constant, source_default

T = TypeVar("T")


class Option:
    """Base of an option's dataclass: the rules that tie its keys to the rest of the config."""

    def rules(self, cfg: Any) -> list[str]:
        """Errors that involve other sections; `cfg` is a TrainConfig or a Partial (a bad
        section is None there: skip a rule that needs it). None by default."""
        return []


@dataclass(frozen=True)
class Group:
    """A config group: `precision=bf16` picks its option `bf16`."""

    name: str
    doc: str  # one line, for --help and docs/keys.md
    selector: str | None = "name"  # the key naming the option inside the section; None: one option
    shorthand: str | None = None  # `group=VALUE` may set this key (preflight=only is preflight.mode=only)
    custom: type | None = None  # the schema of a section naming your own code with `_target_`


_GROUPS: dict[str, Group] = {}
_OPTIONS: dict[str, dict[str, Any]] = {}
_loaded = False


def declare(name: str, doc: str, **kwargs: Any) -> Group:
    """Declare a config group (once, in its module under clorch.config.options)."""
    group = Group(name, doc, **kwargs)
    _GROUPS[name] = group
    _OPTIONS.setdefault(name, {})
    return group


def option(group: str, name: str, /, **preset: Any) -> Callable[[type[T]], type[T]]:
    """Class decorator: register `cls(**preset)` as option `name` of `group`.

    Stack it for presets of one class (`checkpoint=final` and `checkpoint=periodic` are one
    CheckpointConfig with other values). Put it above `@dataclass`.

    Raises:
        ValueError: the group is not declared, or the option name is taken.
    """

    def add(cls: type[T]) -> type[T]:
        if group not in _GROUPS:
            raise ValueError(f"option {name!r} joins an undeclared group {group!r}; declare() it first")
        if name in _OPTIONS[group]:
            raise ValueError(f"{group}={name} is registered twice ({cls.__qualname__})")
        _OPTIONS[group][name] = cls(**preset)
        return cls

    return add


ENTRY_POINTS = "clorch.options"
"""The entry-point group through which an installed package of yours adds options: each entry
names a module that registers them (`[project.entry-points."clorch.options"] mine = "my_pkg.options"`)."""


def _load() -> None:
    """Import every module of clorch.config.options once (each registers its options), then the
    modules installed packages name in the `clorch.options` entry-point group."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    package = importlib.import_module("clorch.config.options")
    for found in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        importlib.import_module(f"{package.__name__}.{found.name}")
    for entry in sorted(entry_points(group=ENTRY_POINTS), key=lambda e: e.name):
        importlib.import_module(entry.value)


def groups() -> dict[str, Group]:
    """Every config group by name (the `backend` and `recipe` groups aside)."""
    _load()
    return dict(_GROUPS)


def options(group: str) -> dict[str, Any]:
    """Option name -> that option's values (an instance of its dataclass) for `group`.

    Raises:
        KeyError: no such group.
    """
    _load()
    return _OPTIONS[group]


def schemas(group: str) -> dict[str, type]:
    """Option name -> its dataclass, for `group`."""
    return {name: type(values) for name, values in options(group).items()}


def custom_groups() -> dict[str, type]:
    """Group -> the schema of its `_target_` section, for the groups that take your own code."""
    return {name: g.custom for name, g in groups().items() if g.custom is not None}


def rule(**metadata: Any) -> dict[str, Any]:
    """Field metadata read by the checks: gt, ge, lt, le (bounds), unit, length/items/words (lists),
    path=True (a file or directory, made absolute against where the user ran clorch-train)."""
    return metadata


def default_of(owner: str | Callable[..., Any] | type, name: str) -> Any:
    """The default of argument `name` of `owner`: a function, a class's __init__, a dataclass, or
    "module:Name" read from the source without importing the module (so no torch is imported)."""
    if isinstance(owner, str):
        module, _, attr = owner.partition(":")
        return source_default(module, attr, name)
    if dataclasses.is_dataclass(owner):
        return {f.name: f.default for f in dataclasses.fields(owner)}[name]
    return inspect.signature(owner).parameters[name].default


def constant_of(module: str, name: str) -> Any:
    """A module-level constant read from the source (clorch.config.source_defaults)."""
    return source_constant(module, name)


def path_keys() -> tuple[str, ...]:
    """ "group.key" of every field marked `rule(path=True)`, in any option or `_target_` schema."""
    found: dict[str, None] = {}
    for name in groups():
        classes = [*schemas(name).values(), *([custom_groups()[name]] if name in custom_groups() else [])]
        for cls in classes:
            for f in dataclasses.fields(cls):
                if f.metadata.get("path"):
                    found[f"{name}.{f.name}"] = None
    return tuple(found)


def resolve(reference: str) -> Any:
    """The object a "module:name" string names (imports the module: call it from clorch.plan or
    the engine, never while checking a config)."""
    module, _, attr = reference.partition(":")
    return getattr(importlib.import_module(module), attr)
