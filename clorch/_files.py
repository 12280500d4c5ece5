"""Small file helpers shared by the launcher and the engine (no torch import)."""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
from pathlib import Path
from typing import Any

# Random names collide about never; a few retries cover a name someone planted on purpose.
_CREATE_ATTEMPTS = 16


def unique_token() -> str:
    """A name fragment no other writer (this process, another process, a retry) will pick."""
    return f"{os.getpid()}-{secrets.token_hex(6)}"


_TOKEN_PATTERN = r"\d+-[0-9a-f]{12}"  # what unique_token() returns


def created_files(directory: str | os.PathLike, prefix: str, suffix: str) -> list[Path]:
    """The files in `directory` that `create_exclusive(directory, prefix, suffix)` could have made.

    Exactly `<prefix><unique token><suffix>`: a looser pattern (`prefix*suffix`)
    would also match names that merely extend the prefix, e.g. `ckpt.best.<token>.tensors`
    for the prefix `ckpt.`.
    """
    own = re.compile(re.escape(prefix) + _TOKEN_PATTERN + re.escape(suffix))
    return [path for path in Path(directory).iterdir() if own.fullmatch(path.name)]


def create_exclusive(directory: str | os.PathLike, prefix: str, suffix: str, mode: int = 0o666) -> tuple[int, Path]:
    """Create a new file `prefix<random>suffix` in `directory`; return its write descriptor and path.

    The file is created with O_CREAT | O_EXCL, so nothing that is already at
    the chosen name is ever opened: not a file another writer owns, and not a
    symlink planted there (O_EXCL does not follow it, so its target is never
    written). A taken name is retried with another random fragment.

    Args:
        directory: where to create the file (beside its final path, so that a
            rename onto that path stays on one filesystem and is atomic).
        prefix, suffix: the name around the random fragment.
        mode: permission bits, filtered by the umask as for any new file.

    Raises:
        FileExistsError: every one of several random names was taken.
        OSError: the directory is missing or not writable.
    """
    directory = Path(directory)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(_CREATE_ATTEMPTS):
        candidate = directory / f"{prefix}{unique_token()}{suffix}"
        try:
            return os.open(candidate, flags, mode), candidate
        except FileExistsError:
            continue
    raise FileExistsError(
        f"could not create a new file {prefix}*{suffix} in {directory}: {_CREATE_ATTEMPTS} random names were all taken"
    )


def write_all(fd: int, data: Any) -> None:
    """Write every byte of `data` (bytes-like) to `fd`; os.write may write fewer per call."""
    view = memoryview(data).cast("B")
    while view.nbytes:
        view = view[os.write(fd, view) :]


def write_json_atomic(path: str | os.PathLike, data: Any, **dumps_options: Any) -> None:
    """Write `data` as JSON through a temporary file beside `path`, then rename it over `path`.

    A reader never sees half a file. The temporary is created exclusively
    (see `create_exclusive`) under a random name, so a file or symlink planted
    beside `path` is never written through, and it is removed if writing fails.
    `dumps_options` go to `json.dumps`; its TypeError/ValueError (a value JSON
    cannot hold) is raised before anything is written.
    """
    write_text_atomic(path, json.dumps(data, **dumps_options))


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` through a temporary file beside `path`, then rename it over `path`
    (see `write_json_atomic`)."""
    write_bytes_atomic(path, text.encode())


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` through a temporary file beside `path`, then rename it over `path`
    (see `write_json_atomic`)."""
    path = Path(path)
    fd, tmp = create_exclusive(path.parent, f".{path.name}.", ".tmp")
    try:
        try:
            write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
