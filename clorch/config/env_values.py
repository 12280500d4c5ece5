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


def _decodes(key: str, value: Any) -> bool:
    """Whether `value` is `${oc.env:NAME,default}` (alone) for a key that takes more than text,
    with a default or a variable that is set (else it is left as typed, for the error to show it so)."""
    if not (
        isinstance(value, str)
        and value.startswith("${oc.env:")
        and value.endswith("}")
        and value.count("${") == 1
        and not _takes_text_only(key)
    ):
        return False
    name, comma, _ = value[len("${oc.env:") : -1].partition(",")
    return bool(comma) or name.strip() in os.environ


def _env_value(key: str, value: Any) -> Any:
    """`${oc.env:NAME,default}` as `${oc.decode:${oc.env:NAME,default}}` for a key that takes
    more than text (`_decodes`): the variable's text is read as YAML would read it (`3` an int,
    `true` a bool), as the key needs and as the config errors recommend."""
    return "${oc.decode:" + value + "}" if _decodes(key, value) else value


def env_values(node: dict, prefix: str = "") -> None:
    """`_env_value` on each value of a recipe, in place."""
    for key, value in node.items():
        if isinstance(value, dict):
            env_values(value, f"{prefix}{key}.")
        elif key != "defaults" or prefix:
            node[key] = _env_value(f"{prefix}{key}", value)


def decodes_env(override: str) -> bool:
    """Whether a command-line override is `KEY=${oc.env:NAME,default}` to be read as the key's
    type (`env_decoded`)."""
    key, sep, value = override.partition("=")
    return bool(sep) and not key.startswith("~") and _decodes(key.lstrip("+"), value.strip("'\""))


def env_decoded(override: str) -> str:
    """`KEY=${oc.env:NAME,default}` as `KEY='${oc.decode:${oc.env:NAME,default}}'` (quoted:
    Hydra's grammar)."""
    key, _, value = override.partition("=")
    text = value.strip("'\"")
    return f"{key}='${{oc.decode:{text}}}'"
