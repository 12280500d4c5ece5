"""Whether the run can write where its config says, probed before anything launches."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


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
