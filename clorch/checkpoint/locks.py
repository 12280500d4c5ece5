"""Locks that keep two writers of one checkpoint, or two runs of one directory, apart.

* `path_lock(path)`: held by `save_checkpoint` while it writes, commits and
  cleans up `path` (a lock on the directory itself). Two processes saving to the same path (two scripts, or a
  script that forgot its process group) take turns: each save lands whole,
  and neither deletes the archive the other's committed metadata names.
* `DirectoryLock`: held by a training job for its whole life on its
  checkpoint directory. It belongs to the job, not to one process: the nodes
  of one job (the same `job` id, such as torchrun's rendezvous id) share it,
  and a run of another job that tries to use the directory meanwhile is
  refused with a message naming the owner.

Both are `flock` locks (on the directory, and on a small hidden file in it):
the operating system releases them when the holder exits, however it exits,
so a crashed run never leaves a stale lock. (On network filesystems flock is only as good
as the filesystem's lock support.)

How the nodes of one job share the directory's lock: the first process takes
the lock file exclusively, writes its job id (and pid, host, run directory)
into it, then turns its lock into a shared one. A later process that finds
the file locked takes a shared lock too and reads the job id: the same job
keeps it (the directory is released when the job's last process ends), any
other job lets go and is refused. Nobody can take the exclusive lock, so
nobody can rewrite the job id, while any process of the job still holds its
shared lock.
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
    """Another live job holds the checkpoint directory."""


# How long a process of the job waits for the first one to finish writing the job id
# (it holds the lock exclusively only for those few writes).
JOIN_WAIT_S = 5.0


class DirectoryLock:
    """A job's hold on its checkpoint directory, from `acquire` until `release` (or exit).

    Args:
        directory: the checkpoint directory (created if missing).
        owner: shown to a refused run: {"run_dir": ...} and anything else worth naming.
        job: the job's id, the same on every node of the job (torchrun's rendezvous id,
            SLURM's job id): processes with the same `job` share the lock. None: this
            process alone (a single-node run).

    Raises (from `acquire`):
        DirectoryInUse: another job holds it; the message names its pid, host, job,
            run directory and start time.
    """

    def __init__(self, directory: Path, owner: dict[str, Any], job: str | None = None) -> None:
        self.directory, self.owner, self.job, self._fd = Path(directory), owner, job, None
        self.shared = False  # True once acquired: another process of the job held it first

    @property
    def path(self) -> Path:
        return self.directory / DIRECTORY_LOCK

    def acquire(self) -> "DirectoryLock":
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = _open_lock_file(self.path)
        try:
            if _try_flock(fd, fcntl.LOCK_EX):
                self._claim(fd)
            else:
                self._join(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def _claim(self, fd: int) -> None:
        """First of the job: write who holds it, then share the lock with the job's other processes."""
        os.ftruncate(fd, 0)
        job = {} if self.job is None else {"job": self.job}
        os.write(
            fd,
            json.dumps(
                {
                    **self.owner,
                    **job,
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                }
            ).encode(),
        )
        # Not atomic (flock drops the exclusive lock first): a process that slips in between
        # takes the exclusive lock and rewrites the job id; then this one is refused below.
        if not _try_flock(fd, fcntl.LOCK_SH):
            self._join(fd)

    def _join(self, fd: int) -> None:
        """Held by another process: share it if that process belongs to this job, else refuse."""
        deadline = time.monotonic() + JOIN_WAIT_S
        while not _try_flock(fd, fcntl.LOCK_SH):
            holder = _read_owner(fd)  # empty while the first process is still writing it
            if (holder and holder.get("job") != self.job) or time.monotonic() >= deadline:
                raise self._in_use(holder)  # another job, or an exclusive holder that stays
            time.sleep(0.05)
        holder = _read_owner(fd)  # read under the shared lock: nobody rewrites it now
        if self.job is None or holder.get("job") != self.job:
            raise self._in_use(holder)
        self.shared = True

    def _in_use(self, holder: dict[str, Any]) -> DirectoryInUse:
        return DirectoryInUse(
            f"checkpoint directory {self.directory} is in use by another run ({_describe(holder)}): "
            "two runs writing one directory would mix and prune each other's checkpoints; wait for "
            "it to end or choose another checkpoint.dir"
            + (f" (the nodes of one job share it; this run is job {self.job})" if self.job else "")
        )

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "DirectoryLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _try_flock(fd: int, kind: int) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _read_owner(fd: int) -> dict[str, Any]:
    try:
        return json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}


def _describe(owner: dict[str, Any]) -> str:
    if not owner:
        return "owner unknown"
    parts = [f"pid {owner.get('pid')} on {owner.get('host')}"]
    if owner.get("job"):
        parts.append(f"job {owner['job']}")
    if owner.get("run_dir"):
        parts.append(f"run directory {owner['run_dir']}")
    if owner.get("since"):
        parts.append(f"since {owner['since']}")
    return ", ".join(parts)
