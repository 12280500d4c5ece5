"""The `_target_` allow-list: which classes and functions a config may name.

A config file must not be able to import arbitrary code. A `_target_` is
imported and the *resolved* object's own module (`obj.__module__`) must start
with an allowed prefix, so an alias such as `logging.os.system` (whose module
is `posix`) is refused even though its dotted path starts with an innocent name.
"""

from __future__ import annotations

import importlib
from typing import Any, Iterator, Mapping

DEFAULT_PREFIXES = ("clorch", "torch.optim", "torch.nn")
_user_prefixes: list[str] = []


def register_target_prefix(prefix: str) -> None:
    """Allow `_target_`s whose resolved module is `prefix` or under it.

    Raises:
        ValueError: an empty or malformed prefix.
    """
    if not isinstance(prefix, str) or not prefix or prefix.startswith(".") or " " in prefix:
        raise ValueError(f"prefix must be a dotted module name such as 'mypkg.models', got {prefix!r}")
    if prefix not in _user_prefixes:
        _user_prefixes.append(prefix)


def allowed_prefixes() -> tuple[str, ...]:
    """The built-in prefixes plus the registered ones."""
    return (*DEFAULT_PREFIXES, *_user_prefixes)


def _allowed(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in allowed_prefixes())


def _import(path: str) -> Any:
    """Import `a.b.c` as an attribute chain from the longest importable module."""
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
        return [f"{where}={path!r} is not allowed: targets must live under {allowed} "
                "(register more with clorch.config.register_target_prefix)"]
    try:
        obj = _import(path)
    except (ImportError, AttributeError) as exc:
        return [f"{where}={path!r} does not import: {exc}"]
    module = getattr(obj, "__module__", None) or getattr(obj, "__name__", "")
    if not _allowed(module):
        return [f"{where}={path!r} resolves to {module}.{getattr(obj, '__qualname__', '?')}, "
                f"outside the allow-list ({allowed})"]
    return []


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
