"""Paths in the config made absolute against the directory the user ran from."""

from __future__ import annotations

import os
from typing import Any

from clorch.config.checks import make_paths_absolute, to_plain


def with_absolute_paths(cfg: Any, base: str | os.PathLike) -> dict[str, Any]:
    """A plain copy of the composed config whose relative paths are made absolute against `base`.

    With `hydra.job.chdir=true` the job runs in its run directory; the paths a
    user typed are relative to where they ran `clorch-train`, and are checked and
    read from there, once, whatever the ranks' working directory. (The checks do the
    same on their own copy: `clorch.config.checks.checked_partial(cfg, base=...)`.)

    Raises:
        ConfigError: an interpolation does not resolve (the message names its key).
    """
    values = to_plain(cfg)
    make_paths_absolute(values, base)
    return values
