"""Durable files: unique names, fsync, atomic rename, directory fsync.

A checkpoint is committed by one `os.replace` of its metadata file onto the
target path. Before that rename every byte it names is fsynced and every new
directory entry is durable; after it the directory is fsynced again, so the
commit itself survives a power cut. A crash at any earlier moment leaves only
uniquely named leftovers that no committed metadata points to.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

TEST_HOOK_VARIABLE = "CLORCH_CHECKPOINT_TEST_PAUSE"


def unique_token() -> str:
    """A name fragment no other save (this process, another process, a retry) will pick."""
    return f"{os.getpid()}-{secrets.token_hex(4)}"


def fsync_dir(directory: Path) -> None:
    """Make the directory's entries (creations, renames) durable. A no-op where dirs can't be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # e.g. Windows: renames there are durable once they return
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: Path, data: bytes) -> None:
    """Write `data` to a new file at `path` and fsync it (the directory entry is not synced here)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(temporary: Path, target: Path) -> None:
    """Atomically put `temporary` at `target` (replacing what was there) and make it durable.

    The directory is fsynced first, so the files the new target refers to
    are durable before the rename, and again after, so the rename is.
    """
    fsync_dir(target.parent)
    os.replace(temporary, target)
    fsync_dir(target.parent)


def remove_quietly(path: Path) -> bool:
    """Delete `path` if it exists; True when something was deleted."""
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False


def test_pause(point: str) -> None:
    """Stop forever at `point` when the crash tests ask for it (CLORCH_CHECKPOINT_TEST_PAUSE).

    The variable holds "point:file"; reaching that point creates `file` (the
    test's signal that the writer is there) and sleeps until killed. Unset in
    normal use, so this costs one dictionary lookup.
    """
    request = os.environ.get(TEST_HOOK_VARIABLE)
    if not request:
        return
    wanted, _, signal_file = request.partition(":")
    if wanted != point:
        return
    Path(signal_file).write_text(point)
    while True:
        time.sleep(1)
