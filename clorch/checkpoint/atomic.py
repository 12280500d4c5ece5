"""Durable files: exclusive creation, fsync, atomic rename, directory fsync.

A checkpoint is committed by one `os.replace` of its metadata file onto the
target path. Before that rename every byte it names is fsynced and every new
directory entry is durable; after it the directory is fsynced again, so the
commit itself survives a power cut. A crash at any earlier moment leaves only
uniquely named leftovers that no committed metadata points to.

Every new file is created with O_CREAT | O_EXCL under a random name
(`clorch._files.create_exclusive`): a symlink planted at a temporary's name is
never followed. Every existing file is opened without blocking and checked to
be a regular file before it is read, so a FIFO or a device never hangs a load.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from clorch import _files
from clorch._files import create_exclusive
from clorch.checkpoint.errors import CheckpointError

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


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


def write_durable(directory: Path, prefix: str, suffix: str, data: bytes) -> Path:
    """Write `data` to a new, exclusively created file in `directory`, fsync it, return its path.

    The directory entry is not synced here. On any failure the partial file is
    removed before the error propagates.
    """
    fd, path = create_exclusive(directory, prefix, suffix, 0o644)
    try:
        try:
            _files.write_all(fd, data)  # looked up at call time: tests inject ENOSPC there
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        remove_quietly(path)
        raise
    return path


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


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words, from its st_mode ("a FIFO (named pipe)", ...)."""
    for test, words in _KINDS:
        if test(mode):
            return words
    return "not a regular file"


def open_regular(path: Path, what: str) -> int:
    """Open `path` read-only and return its descriptor, only if it is a regular file.

    O_NONBLOCK makes opening a FIFO return at once instead of waiting for a
    writer; the type is then checked on the opened descriptor itself, so a
    file swapped in after a separate stat could not slip through.

    Args:
        path: the file to open (symlinks are followed, as by open()).
        what: how errors name it ("checkpoint path", "checkpoint archive").

    Raises:
        FileNotFoundError: nothing at `path`.
        CheckpointError: `path` is a directory, FIFO, socket or device.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except IsADirectoryError:  # where directories cannot be opened at all
        raise CheckpointError(f"{what} {path} is a directory, expected a regular file") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise CheckpointError(f"{what} {path} is {file_kind(mode)}, expected a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd
