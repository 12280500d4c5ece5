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
