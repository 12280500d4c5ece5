"""Whether the run can write where its config says, probed before anything launches."""

from __future__ import annotations

import copy
import os
import tempfile
from pathlib import Path
from typing import Any


def _nearest_existing(directory: Path) -> Path:
    """`directory`, or its closest ancestor that exists (what a mkdir -p would write into)."""
    path = directory.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def unwritable(directory: str | os.PathLike) -> str | None:
    """Why files cannot be created in `directory` (or where it would be made), or None.

    Probes by creating and removing a temporary file in the directory, or in its
    nearest existing ancestor when it does not exist yet: permission bits alone do
    not tell (read-only mounts, /proc, root), and nothing is left behind.
    """
    target = _nearest_existing(Path(directory).expanduser())
    if not target.is_dir():
        return f"{target} is not a directory"
    try:
        with tempfile.NamedTemporaryFile(dir=target, prefix=".clorch-probe-"):
            pass
    except OSError as exc:
        return f"creating a file in {target} failed: {exc.strerror or exc}"
    return None


# Config keys that name files or directories, resolved against the directory the user ran from.
PATH_KEYS = (("data", "path"), ("checkpoint", "dir"), ("checkpoint", "path"), ("checkpoint", "resume"))
_NOT_PATHS = {"none", "latest"}  # checkpoint.resume's words


def with_absolute_paths(cfg: Any, base: str | os.PathLike) -> dict[str, Any]:
    """A plain copy of the composed config whose relative paths are made absolute against `base`.

    With `hydra.job.chdir=true` the job runs in its run directory; the paths a
    user typed are relative to where they ran `clorch-train`, and are checked and
    read from there, once, whatever the ranks' working directory.
    """
    from omegaconf import DictConfig, OmegaConf

    values = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else copy.deepcopy(dict(cfg))
    for section, key in PATH_KEYS:
        node = values.get(section)
        value = node.get(key) if isinstance(node, dict) else None
        if isinstance(value, str) and value and value not in _NOT_PATHS:
            path = Path(value).expanduser()
            node[key] = str(path if path.is_absolute() else Path(base) / path)
    return values
