"""`KEY=${oc.env:NAME,default}` read as the key's type.

OmegaConf's `oc.env` gives text: `epochs='${oc.env:EPOCHS,3}'` would be the string
'3', refused by the check of an int key although the config errors recommend this
very form. clorch-train reads it through `oc.decode` (`3` an int, `true` a bool, as
YAML reads them) for every key that takes more than text; keys that take text
(paths, addresses) keep it as text.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from typing import Any, Optional

from clorch.config import registry
from clorch.config.schema import TopConfig


def _takes_text_only(key: str) -> bool:
    """Whether every schema field that dotted `key` names (a group's key: in any of its options)
    takes only text (`str`, or `str` or null); False for a key the schema does not have."""
    head, _, rest = key.partition(".")
    if not rest:
        classes, path = [TopConfig], [head]
    elif head in registry.groups():
        classes, path = list(registry.schemas(head).values()), rest.split(".")
    else:
        return False
    found = []
    for cls in classes:
        for i, name in enumerate(path):
            hints = typing.get_type_hints(cls) if dataclasses.is_dataclass(cls) else {}
            if name not in hints:
                break
            if i < len(path) - 1:
                cls = hints[name]
                continue
            found.append(hints[name] in (str, Optional[str]))
    return bool(found) and all(found)


def _env_value(key: str, value: Any) -> Any:
    """`${oc.env:NAME,default}` as `${oc.decode:${oc.env:NAME,default}}` for a key that takes
    more than text: the variable's text is read as YAML would read it (`3` an int, `true` a bool),
    as the key needs and as the config errors recommend."""
    if (
        isinstance(value, str)
        and value.startswith("${oc.env:")
        and value.endswith("}")
        and value.count("${") == 1
        and not _takes_text_only(key)
    ):
        name, comma, _ = value[len("${oc.env:") : -1].partition(",")
        if comma or name.strip() in os.environ:  # else left as typed, for the error to show it so
            return "${oc.decode:" + value + "}"
    return value


def env_values(node: dict, prefix: str = "") -> None:
    """`_env_value` on each value of a recipe, in place."""
    for key, value in node.items():
        if isinstance(value, dict):
            env_values(value, f"{prefix}{key}.")
        elif key != "defaults" or prefix:
            node[key] = _env_value(f"{prefix}{key}", value)


def with_env_values(overrides: list[str]) -> list[str]:
    """`KEY=${oc.env:NAME,default}` overrides read as the key's type (`_env_value`)."""
    out = []
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep and not key.startswith("~"):
            text = value.strip("'\"")
            decoded = _env_value(key.lstrip("+"), text)
            item = item if decoded == text else f"{key}='{decoded}'"  # quoted: Hydra's grammar
        out.append(item)
    return out
