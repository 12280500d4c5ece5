"""Paths in the config made absolute against the directory the user ran from."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from clorch.config import registry
from clorch.config.checks import to_plain

_NOT_PATHS = {"none", "latest"}  # checkpoint.resume's words


def with_absolute_paths(cfg: Any, base: str | os.PathLike) -> dict[str, Any]:
    """A plain copy of the composed config whose relative paths are made absolute against `base`.

    With `hydra.job.chdir=true` the job runs in its run directory; the paths a
    user typed are relative to where they ran `clorch-train`, and are checked and
    read from there, once, whatever the ranks' working directory.

    Raises:
        ConfigError: an interpolation does not resolve (the message names its key).
    """
    values = to_plain(cfg) if isinstance(cfg, DictConfig) else copy.deepcopy(dict(cfg))
    for section, _, key in (k.partition(".") for k in registry.path_keys()):
        node = values.get(section)
        value = node.get(key) if isinstance(node, dict) else None
        if isinstance(value, str) and value and value not in _NOT_PATHS:
            path = Path(value).expanduser()
            node[key] = str(path if path.is_absolute() else Path(base) / path)
    return values
