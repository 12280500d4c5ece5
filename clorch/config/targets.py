"""The `_target_` allow-list: which classes and functions a config may name.

A config file must not be able to import arbitrary code. A `_target_` is
imported and the *resolved* object's own module (`obj.__module__`) must start
with an allowed prefix, so an alias such as `logging.os.system` (whose module
is `posix`) is refused even though its dotted path starts with an innocent name.

Who extends the list is the person who runs the job, never a config file:

* `CLORCH_TRUSTED_MODULES=my_project,other.pkg` in the environment;
* an installed package that declares itself under the entry-point group
  `clorch.trusted_modules` (in its pyproject.toml:
  `[project.entry-points."clorch.trusted_modules"]` `my_project = "my_project"`);
* `register_target_prefix("my_project")` in a Python program.

As with `python -m`, the current working directory is importable for trusted
modules, so `cd my_project_root && CLORCH_TRUSTED_MODULES=my_project clorch-train ...`
needs no install.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import sys
from importlib.metadata import entry_points
from typing import Any, Iterator, Mapping

DEFAULT_PREFIXES = ("clorch", "torch.optim", "torch.nn")
TRUSTED_VARIABLE = "CLORCH_TRUSTED_MODULES"
ENTRY_POINT_GROUP = "clorch.trusted_modules"
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_user_prefixes: list[str] = []


def register_target_prefix(prefix: str) -> None:
    """Allow `_target_`s whose resolved module is `prefix` or under it (in this process).

    Ranks started by clorch's launcher are new processes: name your modules in
    CLORCH_TRUSTED_MODULES (which they inherit) when a run should reach them there.

    Raises:
        ValueError: an empty or malformed prefix.
    """
    if not isinstance(prefix, str) or not _MODULE_NAME.match(prefix):
        raise ValueError(f"prefix must be a dotted module name such as 'mypkg.models', got {prefix!r}")
    if prefix not in _user_prefixes:
        _user_prefixes.append(prefix)


def _env_modules(environ: Mapping[str, str]) -> list[str]:
    return [m.strip() for m in environ.get(TRUSTED_VARIABLE, "").split(",") if m.strip()]


@functools.lru_cache(maxsize=1)
def _entry_point_modules() -> tuple[str, ...]:
    """Installed packages' declarations (read once: installing a package restarts no process)."""
    return tuple(ep.value.split(":")[0].strip() for ep in entry_points(group=ENTRY_POINT_GROUP))


def trusted_modules(environ: Mapping[str, str] | None = None) -> dict[str, list[str]]:
    """The modules the person running the job trusts, by where each was named:
    {"CLORCH_TRUSTED_MODULES": [...], "entry points": [...], "registered": [...]}
    (only the valid names; `trusted_module_errors` reports the others)."""
    environ = os.environ if environ is None else environ
    found = {
        TRUSTED_VARIABLE: _env_modules(environ),
        "entry points": list(_entry_point_modules()),
        "registered": list(_user_prefixes),
    }
    return {where: [m for m in names if _MODULE_NAME.match(m)] for where, names in found.items()}


def trusted_module_errors(environ: Mapping[str, str] | None = None) -> list[str]:
    """An error for each name in CLORCH_TRUSTED_MODULES or an entry point that is no module name."""
    environ = os.environ if environ is None else environ
    bad = [(TRUSTED_VARIABLE, m) for m in _env_modules(environ) if not _MODULE_NAME.match(m)]
    bad += [(f"entry point group {ENTRY_POINT_GROUP}", m) for m in _entry_point_modules() if not _MODULE_NAME.match(m)]
    return [
        f"{where} names {m!r}, which is not a dotted module name; write e.g. "
        f"{TRUSTED_VARIABLE}=my_project,other_pkg.models"
        for where, m in bad
    ]


def _trusted() -> tuple[str, ...]:
    return tuple(m for names in trusted_modules().values() for m in names)


def allowed_prefixes() -> tuple[str, ...]:
    """The built-in prefixes plus the trusted modules (environment, entry points, registered)."""
    return tuple(dict.fromkeys((*DEFAULT_PREFIXES, *_trusted())))


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _cwd_importable() -> None:
    """Put the working directory on sys.path (first, as `python -m` does) for trusted modules."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def _allowed(module: str) -> bool:
    return _within(module, allowed_prefixes())


def _import(path: str) -> Any:
    """Import `a.b.c` as an attribute chain from the longest importable module."""
    if not _within(path, DEFAULT_PREFIXES):
        _cwd_importable()
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"no importable module in {path!r}")


def resolve_target(path: str) -> Any:
    """Import a `_target_` and check it against the allow-list.

    Raises:
        ValueError: the target does not import, or resolves outside the allow-list.
    """
    errors = check_target("_target_", path)
    if errors:
        raise ValueError(errors[0])
    return _import(path)


def check_target(where: str, path: Any) -> list[str]:
    """Errors for one `_target_` value found at config key `where`."""
    allowed = ", ".join(allowed_prefixes())
    if not isinstance(path, str) or not path:
        return [f"{where} must be a dotted name, got {path!r}"]
    if not _allowed(path):
        top = path.split(".")[0]
        return [
            f"{where}={path!r} is not allowed: targets must live under {allowed}; to trust your "
            f"own code, name it where you run the job: {TRUSTED_VARIABLE}={top} clorch-train ... "
            f"(or declare the entry-point group {ENTRY_POINT_GROUP} in its package); a config "
            "file cannot extend this list"
        ]
    try:
        obj = _import(path)
    except (ImportError, AttributeError) as exc:
        return [
            f"{where}={path!r} does not import: {exc} (the working directory and the installed packages are searched)"
        ]
    except Exception as exc:  # the user's module raised while importing
        return [f"{where}={path!r} does not import: {type(exc).__name__}: {exc}"]
    module = getattr(obj, "__module__", None) or getattr(obj, "__name__", "")
    if not _allowed(module):
        return [
            f"{where}={path!r} resolves to {module}.{getattr(obj, '__qualname__', '?')}, "
            f"outside the allow-list ({allowed})"
        ]
    return []


def has_target(value: Any) -> bool:
    """Whether a config value holds a `_target_` anywhere (an object to build)."""
    return any(True for _ in find_targets(value)) if isinstance(value, (Mapping, list, tuple)) else False


class TargetBuildError(ValueError):
    """A nested `_target_` raised while being built; `key` names it ("model.config"), and
    `__cause__` is what it raised."""

    def __init__(self, key: str, target: Any, cause: BaseException):
        self.key = key
        super().__init__(f"{key}._target_={target}: building it raised {type(cause).__name__}: {cause}")


def instantiate_nested(kwargs: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A section's keyword arguments with every nested `{_target_: ...}` built, by Hydra's
    rules (`hydra.utils.instantiate`: inner objects first, `_partial_`, `_args_`); the other
    values are left as plain containers.

    Each nested target is checked against the allow-list first (the config checks did so
    before launch; this keeps a Python caller to the same rule).

    Raises:
        ValueError: a nested target outside the allow-list.
        TargetBuildError: a nested target raised while being built (its __cause__).
    """
    built = dict(kwargs)
    for key, value in kwargs.items():
        if not has_target(value):
            continue
        for inner, path in find_targets(value, f"{where}.{key}."):
            errors = check_target(inner, path)
            if errors:
                raise ValueError(errors[0])
        from hydra.utils import instantiate  # lazy: Hydra stays out of clorch-train's start

        try:
            built[key] = instantiate(value, _convert_="all")
        except Exception as exc:  # the target's own error, wrapped by Hydra
            cause = exc
            while cause.__cause__ is not None and type(cause).__module__.startswith("hydra"):
                cause = cause.__cause__
            target = value.get("_target_", "?") if isinstance(value, Mapping) else "?"
            raise TargetBuildError(f"{where}.{key}", target, cause) from cause
    return built


def find_targets(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every (key, value) of a `_target_` anywhere in a config mapping."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            where = f"{prefix}{key}"
            if key == "_target_":
                yield where, value
            else:
                yield from find_targets(value, where + ".")
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from find_targets(value, f"{prefix}[{i}].")
