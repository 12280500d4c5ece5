"""Locks that keep two writers of one checkpoint, or two runs of one directory, apart.

* `path_lock(path)`: held by `save_checkpoint` while it writes, commits and
  cleans up `path` (a lock on the directory itself). Two processes saving to the same path (two scripts, or a
  script that forgot its process group) take turns: each save lands whole,
  and neither deletes the archive the other's committed metadata names.
* `DirectoryLock`: held by a training run for its whole life on its
  checkpoint directory; a second run that tries to use the directory
  meanwhile is refused with a message naming the owner.

Both are `flock` locks (on the directory, and on a small hidden file in it):
the operating system releases them when the holder exits, however it exits,
so a crashed run never leaves a stale lock. (On network filesystems flock is only as good
as the filesystem's lock support.)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Iterator

from clorch.checkpoint.errors import CheckpointError

DIRECTORY_LOCK = ".clorch-run.lock"


def _open_lock_file(path: Path) -> int:
    """Open (creating) a lock file without following a symlink planted at its name."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(path, flags, 0o644)
    except OSError as exc:
        raise CheckpointError(f"cannot open the lock file {path}: {exc.strerror or exc}") from None


@contextlib.contextmanager
def path_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock for writing checkpoint `path`; waits while another process holds it.

    The lock is on the directory itself (saves to other names there wait too, briefly), so
    it leaves no file behind.
    """
    try:
        fd = os.open(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise CheckpointError(f"cannot open the checkpoint directory {path.parent}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


class DirectoryInUse(CheckpointError):
    """Another live run holds the checkpoint directory."""


class DirectoryLock:
    """A run's hold on its checkpoint directory, from `acquire` until `release` (or exit).

    Raises (from `acquire`):
        DirectoryInUse: another process holds it; the message names its pid, host,
            run directory and start time.
    """

    def __init__(self, directory: Path, owner: dict[str, Any]) -> None:
        self.directory, self.owner, self._fd = Path(directory), owner, None

    @property
    def path(self) -> Path:
        return self.directory / DIRECTORY_LOCK

    def acquire(self) -> "DirectoryLock":
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = _open_lock_file(self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_owner(fd)
            os.close(fd)
            raise DirectoryInUse(
                f"checkpoint directory {self.directory} is in use by another run ({_describe(holder)}): "
                "two runs writing one directory would mix and prune each other's checkpoints; wait for "
                "it to end or choose another checkpoint.dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({**self.owner, "pid": os.getpid(), "host": socket.gethostname(),
                                 "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "DirectoryLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _read_owner(fd: int) -> dict[str, Any]:
    try:
        return json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}


def _describe(owner: dict[str, Any]) -> str:
    if not owner:
        return "owner unknown"
    parts = [f"pid {owner.get('pid')} on {owner.get('host')}"]
    if owner.get("run_dir"):
        parts.append(f"run directory {owner['run_dir']}")
    if owner.get("since"):
        parts.append(f"since {owner['since']}")
    return ", ".join(parts)
