"""The YAML text of a value and the comments beside a dataclass's fields, as conf/ and the docs show them."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import tokenize
from functools import lru_cache
from typing import Any

import yaml


def scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text[: -len("\n...")].strip() if text.endswith("...") else text


@lru_cache(maxsize=None)
def field_comments(cls: type) -> dict[str, str]:
    """Field name -> the comment written beside it (or on the lines just above) in the source,
    an inherited field's from the class that declares it (a subclass's own comment wins)."""
    found: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base) and "__dataclass_fields__" in vars(base):
            found.update(_own_field_comments(base))
    return found


def _own_field_comments(cls: type) -> dict[str, str]:
    """The comments of the fields `cls`'s own source declares."""
    source = inspect.getsource(cls)
    comments = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }
    lines = source.splitlines()
    found = {}
    for node in ast.parse(source).body[0].body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        beside = [comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in comments]
        above, n = [], node.lineno - 1
        while n in comments and lines[n - 1].lstrip().startswith("#"):
            above.insert(0, comments[n])
            n -= 1
        text = " ".join(beside or above)
        if text:
            found[node.target.id] = text
    return found
