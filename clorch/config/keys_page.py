"""docs/keys.md and the key table of docs/training.md, written from the registered options.

The same source as conf/ (clorch.config.conf_files, which writes these too): each
option's fields, defaults and the comments beside them. A test fails when a page
differs from its rendering.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterator

from clorch.config import registry
from clorch.config.comments import field_comments, scalar
from clorch.config.schema import BACKENDS, CUSTOM, TopConfig

TABLE_START = "<!-- key table: written by python -m clorch.config.conf_files -->"
TABLE_END = "<!-- end of key table -->"
_HEADER = """# Config keys

Every group, option and key of `clorch-train`, with its default and what it does. Written from
the options in `clorch/config/options/` by `python -m clorch.config.conf_files` (do not edit by
hand: [extending.md](extending.md)). How to set them: [training.md](training.md#config-groups).
"""


def _rows(values: Any, prefix: str = "") -> Iterator[str]:
    comments = field_comments(type(values))
    for f in dataclasses.fields(values):
        value = getattr(values, f.name)
        if dataclasses.is_dataclass(value):
            yield from _rows(value, f"{prefix}{f.name}.")
            continue
        what = comments.get(f.name, "").replace("|", "\\|").replace("<", "&lt;")
        yield f"| `{prefix}{f.name}` | `{scalar(value)}` | {what} |"


def _table(values: Any, prefix: str = "") -> list[str]:
    return ["| key | default | what it does |", "|---|---|---|", *_rows(values, prefix)]


def _first_line(cls: type) -> str:
    return (cls.__doc__ or "").strip().splitlines()[0]


def keys_page() -> str:
    """The whole of docs/keys.md."""
    out = [_HEADER, "## Top level", "", *_table(TopConfig()), ""]
    out += [f"`backend=OPTION` sets the top-level `backend`: {', '.join(f'`{b}`' for b in BACKENDS)}.", ""]
    for name, group in sorted(registry.groups().items()):
        out += [f"## `{name}`", "", f"{group.doc[0].upper()}{group.doc[1:]}.", ""]
        for option, values in sorted(registry.options(name).items()):
            out += [f"### `{name}={option}`", "", _first_line(type(values)), "", *_table(values, f"{name}."), ""]
        if group.custom is not None:
            own = [f.name for f in dataclasses.fields(group.custom) if f.name not in ("target", "kwargs", "name")]
            keys = ", ".join(f"`{name}.{k}`" for k in own) or "none"
            out += [
                f"### `{name}._target_` ({name}={CUSTOM})",
                "",
                f"{_first_line(group.custom)} Keys clorch reads: {keys}.",
                "",
            ]
    return "\n".join(out).rstrip() + "\n"


def key_table() -> str:
    """The group table of docs/training.md: each group, its options, and their keys."""
    lines = [TABLE_START, "| group | options | keys |", "|---|---|---|"]
    lines.append(f"| `backend` | {', '.join(f'`{b}`' for b in BACKENDS)} | |")
    for name, group in sorted(registry.groups().items()):
        options = [f"`{o}`" for o in sorted(registry.options(name))]
        if group.custom is not None:
            options.append(f"your own with `{name}._target_`")
        keys: dict[str, None] = {}
        for cls in registry.schemas(name).values():
            keys.update({f.name: None for f in dataclasses.fields(cls) if f.name not in (group.selector, "name")})
        lines.append(f"| `{name}` | {', '.join(options)} | {', '.join(keys)} |")
    top = ", ".join(f.name for f in dataclasses.fields(TopConfig))
    lines += [f"| top level | | {top} |", TABLE_END]
    return "\n".join(lines)


def with_key_table(page: str) -> str:
    """`page` (docs/training.md) with its key table rewritten.

    Raises:
        ValueError: the page has no key-table markers.
    """
    start, end = page.find(TABLE_START), page.find(TABLE_END)
    if start < 0 or end < start:
        raise ValueError(f"no key table markers ({TABLE_START} ... {TABLE_END}) in the page")
    return page[:start] + key_table() + page[end + len(TABLE_END) :]


def stale_pages(docs: Path) -> list[str]:
    """The pages under `docs` that differ from their rendering."""
    out = []
    keys, training = docs / "keys.md", docs / "training.md"
    if not keys.is_file() or keys.read_text() != keys_page():
        out.append("keys.md")
    if training.is_file() and training.read_text() != with_key_table(training.read_text()):
        out.append("training.md (key table)")
    return out


def write_pages(docs: Path) -> list[str]:
    """Write docs/keys.md and training.md's key table; return the ones that changed."""
    changed = stale_pages(docs)
    (docs / "keys.md").write_text(keys_page())
    training = docs / "training.md"
    if training.is_file():
        training.write_text(with_key_table(training.read_text()))
    return changed
