"""Checking one config section's values against the fields of its schema dataclass.

Each error names the full key, the value received and what is allowed: the
type (from the field's annotation, Literal choices included) and the field's
rules (`gt`, `ge`, `lt`, `le`, `unit`, and `length`/`items`/`words` for
fixed-length lists, in the field's metadata). Unknown keys get a "did you
mean", missing keys their default.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from typing import Any, Iterable, Mapping

from clorch.config.composer import format_value


def _type_name(annotation: Any) -> str:
    if annotation is type(None):
        return "null"
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return "one of " + ", ".join(_shown(a) for a in args)
    if typing.get_origin(annotation) is typing.Union:
        return " or ".join(_type_name(a) for a in args)
    if typing.get_origin(annotation) is list:
        return f"a list of {_type_name(args[0])}"
    if typing.get_origin(annotation) is dict:
        return f"a mapping of {_type_name(args[0])} to {_type_name(args[1])}"
    return getattr(annotation, "__name__", str(annotation))


def _shown(value: Any) -> str:
    return "null" if value is None else str(value)


def _literals(annotation: Any) -> tuple[Any, ...]:
    """The values a Literal annotation allows (also inside Optional/Union), else ()."""
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Union:
        return tuple(v for a in typing.get_args(annotation) for v in _literals(a))
    return ()


def _matches(value: Any, annotation: Any) -> bool:
    if annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return any(value == a and type(value) is type(a) for a in typing.get_args(annotation))
    if origin is typing.Union:
        return any(_matches(value, a) for a in typing.get_args(annotation))
    if origin is list:
        (inner,) = typing.get_args(annotation)
        return isinstance(value, (list, tuple)) and all(_matches(v, inner) for v in value)
    if origin is dict:
        keys, values = typing.get_args(annotation)
        return isinstance(value, Mapping) and all(_matches(k, keys) and _matches(v, values) for k, v in value.items())
    if origin is not None:  # another parameterized generic (isinstance takes only its bare class)
        return isinstance(value, origin)
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


def non_finite(value: Any) -> bool:
    """Whether `value` is or holds inf or nan (JSON and the engine cannot carry them)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return any(non_finite(v) for v in value)
    if isinstance(value, Mapping):
        return any(non_finite(v) for v in value.values())
    return False


def _rule_errors(key: str, value: Any, meta: Mapping[str, Any]) -> list[str]:
    if isinstance(value, (list, tuple)) and "length" in meta:
        if (
            len(value) != meta["length"]
            or _rule_errors(key, value, meta["items"])
            or any(_rule_errors(key, v, meta["items"]) for v in value)
        ):
            return [f"{key} must be {meta['length']} numbers {meta['words']}, got {list(value)!r}"]
        return []
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return []
    for name, test, words in (
        ("gt", lambda v, b: v > b, "> "),
        ("ge", lambda v, b: v >= b, ">= "),
        ("lt", lambda v, b: v < b, "< "),
        ("le", lambda v, b: v <= b, "<= "),
    ):
        if name in meta and not test(value, meta[name]):
            unit = f" ({meta['unit']})" if "unit" in meta else ""
            return [f"{key} must be {words}{meta[name]}{unit}, got {value!r}"]
    return []


def did_you_mean(key: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f"did you mean {close[0]}? " if close else ""


def _unknown_key(
    prefix: str, key: str, fields: Mapping[str, Any], owner: str | None, siblings: Mapping[str, type]
) -> str:
    """The error for a key the schema does not have, naming the option it belongs to if any."""
    full, allowed = f"{prefix}{key}", ", ".join(fields)
    if owner is not None:
        group, option = owner.split("=")
        others = [
            name
            for name, cls in siblings.items()
            if name != option and key in {f.name for f in dataclasses.fields(cls)}
        ]
        if others:
            return (
                f"{full} is not a key of {owner} (it belongs to {group}={' / '.join(others)}); {owner} takes: {allowed}"
            )
    return f"{full} is not a known key; {did_you_mean(key, fields)}allowed: {allowed}"


def _with_article(name: str) -> str:
    """ "an integer", "a float", "a list of str": the type's name as a sentence names it."""
    name = "integer" if name == "int" else name
    return name if name.startswith(("a ", "an ")) else ("an " if name[0] in "aeiou" else "a ") + name


def _value_errors(full: str, value: Any, annotation: Any, meta: Mapping[str, Any]) -> list[str]:
    if non_finite(value):
        what = "hold only finite numbers" if isinstance(value, (list, tuple)) else "be a finite number"
        return [f"{full} must {what}, got {value!r}"]
    choices = _literals(annotation)
    members = typing.get_args(annotation) if typing.get_origin(annotation) is typing.Union else ()
    others = [
        _with_article(_type_name(a))
        for a in members
        if typing.get_origin(a) is not typing.Literal and a is not type(None)
    ]
    if choices and others and (not _matches(value, annotation) or _rule_errors(full, value, meta)):
        # One wording whatever is wrong: `auto` or an integer >= 1, for 0 and for "many" alike.
        bound = next(
            (
                f" {words}{meta[name]}"
                for name, words in (("gt", "> "), ("ge", ">= "), ("lt", "< "), ("le", "<= "))
                if name in meta
            ),
            "",
        )
        shown = " or ".join(_shown(c) for c in choices)
        return [f"{full} must be {shown} or {' or '.join(others)}{bound}, got {value!r}"]
    if choices and not _matches(value, annotation):
        allowed = ", ".join(_shown(c) for c in choices) + "".join(f", or {o}" for o in others)
        return [f"{full}={value!r} is not allowed; choose one of: {allowed}"]
    if not _matches(value, annotation):
        return [f"{full} must be {_type_name(annotation)}, got {value!r}"]
    return _rule_errors(full, value, meta)


def check_section(
    prefix: str,
    values: Mapping[str, Any],
    cls: type,
    owner: str | None = None,
    siblings: Mapping[str, type] | None = None,
) -> list[str]:
    """Check one section against its dataclass: unknown and missing keys, types, rules.

    Args:
        prefix: the section's key path with a trailing dot ("optim."), or "" at the top.
        values: the section's values.
        cls: its schema dataclass.
        owner: "group=option" the section is (named in errors), or None.
        siblings: the group's other options' schemas, to say which option a stray key belongs to.
    """
    errors = []
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in values.items():
        full = f"{prefix}{key}"
        if key == "_target_":
            continue  # reported by _target_errors
        if key not in fields:
            errors.append(_unknown_key(prefix, key, fields, owner, siblings or {}))
            continue
        annotation = hints[key]
        if dataclasses.is_dataclass(annotation):
            if isinstance(value, Mapping):
                errors += check_section(f"{full}.", value, annotation)
            else:
                errors.append(f"{full} must be a mapping, got {value!r}")
        else:
            errors += _value_errors(full, value, annotation, fields[key].metadata)
    for key, f in fields.items():
        if key not in values:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            shown = dataclasses.asdict(default) if dataclasses.is_dataclass(default) else default
            where = f" of {owner}" if owner else ""
            errors.append(
                f"{prefix}{key} is missing (removed with ~{prefix}{key}?): every key{where} "
                f"needs a value; its default is {format_value(shown)}"
            )
    return errors
