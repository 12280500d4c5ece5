"""One section against its schema dataclass: every error names the key, the value and what is allowed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

import pytest

from clorch.config.fields import check_section

pytestmark = pytest.mark.timeout(30)


@dataclass
class Inner:
    size: int = 4


@dataclass
class Section:
    lr: float = field(default=0.1, metadata={"gt": 0, "unit": "per step"})
    kind: Literal["a", "b"] = "a"
    workers: Optional[int] = None
    inner: Inner = field(default_factory=Inner)


def _good(**changes):
    return {"lr": 0.1, "kind": "a", "workers": None, "inner": {"size": 4}, **changes}


def test_a_good_section_has_no_errors():
    assert check_section("opt.", _good(), Section) == []
    assert check_section("opt.", _good(lr=3, workers=2), Section) == []  # an int is a float here


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"lr": 0}, "opt.lr must be > 0 (per step), got 0"),
        ({"lr": float("inf")}, "opt.lr must be a finite number, got inf"),
        ({"lr": True}, "opt.lr must be float, got True"),
        ({"kind": "c"}, "opt.kind='c' is not allowed; choose one of: a, b"),
        ({"workers": "two"}, "opt.workers must be int or null, got 'two'"),
        ({"inner": {"size": 1.5}}, "opt.inner.size must be int, got 1.5"),
        ({"inner": 3}, "opt.inner must be a mapping, got 3"),
        ({"kidn": "a"}, "opt.kidn is not a known key; did you mean kind? allowed: lr, kind, workers, inner"),
    ],
)
def test_each_bad_value_is_named_with_what_is_allowed(changes, message):
    assert message in check_section("opt.", _good(**changes), Section)


def test_a_missing_key_names_its_default():
    values = _good()
    del values["inner"]
    (error,) = check_section("opt.", values, Section, owner="opt=mine")
    assert error == (
        "opt.inner is missing (removed with ~opt.inner?): every key of opt=mine needs a value; its default is {size:4}"
    )


def _schemas() -> list[type]:
    """Every option's dataclass, every `_target_` section's, the top level's, and the dataclasses they nest."""
    import dataclasses
    import typing

    from clorch.config import registry, schema

    found = [schema.TopConfig, *registry.custom_groups().values()]
    found += [cls for group in registry.groups() for cls in registry.schemas(group).values()]
    for cls in found:  # grows as nested sections are found
        found += [
            hint for hint in typing.get_type_hints(cls).values() if dataclasses.is_dataclass(hint) and hint not in found
        ]
    return list(dict.fromkeys(found))


PROBES = (None, True, 0, 2, 0.5, "x", [], [1, "a"], {}, {"_target_": "pkg.fn", "size": 3}, {1: 2})


def test_every_typed_field_of_every_option_checks_any_value_without_raising():
    """`isinstance` takes no parameterized generic (dict[str, Any]): each field's annotation,
    whatever it is, checks its default and a value of every kind, giving errors, never an exception."""
    import dataclasses
    import typing

    from clorch.config.fields import _matches, _value_errors

    checked = 0
    for cls in _schemas():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            annotation = hints[f.name]
            if dataclasses.is_dataclass(annotation):
                continue  # a nested section: its own fields are walked
            default = f.default if f.default is not dataclasses.MISSING else None
            if f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                assert _matches(default, annotation), (cls.__name__, f.name, default, annotation)
            for value in PROBES:
                assert isinstance(_value_errors(f"x.{f.name}", value, annotation, f.metadata), list)
            checked += 1
    assert checked > 100  # every group's options were found


def test_a_mapping_field_checks_its_keys_and_values():
    @dataclass
    class Loader:
        collate_fn: Optional[dict[str, int]] = None

    assert check_section("data.", {"collate_fn": {"_target_": 1}}, Loader) == []
    assert check_section("data.", {"collate_fn": None}, Loader) == []
    assert check_section("data.", {"collate_fn": {"a": "b"}}, Loader) == [
        "data.collate_fn must be a mapping of str to int or null, got {'a': 'b'}"
    ]
    assert check_section("data.", {"collate_fn": [1]}, Loader) == [
        "data.collate_fn must be a mapping of str to int or null, got [1]"
    ]
