"""What a launch adds around its run directory, and who else is using that directory.

Several processes can share one run directory: the nodes of a multi-node job
(`hydra.run.dir` on a shared filesystem), or a second launch pointed at the
directory of a run that is still going. A launch that its config errors stop
takes back what it added (`Footprint.undo`), but only while no other live
process uses the directory: otherwise the files it would remove may be the
other run's, and it leaves the directory as it is.

Who uses a directory is a shared `flock` on a small hidden file in it,
`.hydra/.clorch-users.lock` (`RunDirUse`; beside Hydra's records of the launch), held by every launching `clorch-train`
from before Hydra writes there until it exits, by `clorch.engine.run.execute`
while a run lives and by rank 0 of an outside launcher's job. A launch that
takes back its files first takes that lock exclusively, which it gets only
when it is the directory's last user. The operating system releases the lock
when its holder exits, however it exits; the last user to leave removes the
file. (On network filesystems flock is only as good as the filesystem's lock
support, as for the checkpoint directory's lock.)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from pathlib import Path
from typing import Iterator

USERS_LOCK = Path(".hydra", ".clorch-users.lock")


class RunDirUse:
    """This process's use of a run directory, from `acquire` (which creates the directory)
    until `release` or exit."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory, self._fd = Path(directory), None

    @property
    def path(self) -> Path:
        return self.directory / USERS_LOCK

    def acquire(self) -> "RunDirUse":
        """Take the shared lock. Blocks only while a refused launch takes its files back.

        Raises:
            OSError: the directory or its lock file cannot be created.
        """
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        while self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(self.path, flags, 0o644)
            except FileNotFoundError:  # the last user removed the folder just now: make it again
                continue
            fcntl.flock(fd, fcntl.LOCK_SH)
            if self._current(fd):
                self._fd = fd
            else:  # removed (or replaced) by the launch we waited for: use the directory as it is now
                os.close(fd)
        return self

    def _current(self, fd: int) -> bool:
        """Whether `fd` is still the file at `path` (a lock on a removed file protects nothing)."""
        try:
            return os.path.samestat(os.fstat(fd), os.stat(self.path, follow_symlinks=False))
        except OSError:
            return False

    def alone(self) -> bool:
        """Turn the shared lock exclusive if no other process uses the directory; say whether it did.

        When it did not, this process no longer holds the lock (flock drops it first): call it
        only on the way out.
        """
        if self._fd is None:
            return False
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def release(self) -> None:
        """Stop using the directory; the last user removes the lock file."""
        if self._fd is None:
            return
        if self.alone() and self._current(self._fd):
            self.path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self.path.parent.rmdir()  # only when the lock was all it held (no Hydra run there)
        os.close(self._fd)
        self._fd = None


@contextlib.contextmanager
def using_run_dir(directory: str | os.PathLike) -> Iterator[None]:
    """Hold a `RunDirUse` of `directory` (created if missing) for the block."""
    use = RunDirUse(directory).acquire()
    try:
        yield
    finally:
        use.release()


class Footprint:
    """What a launch adds around its run directory, so that a launch stopped by config errors
    (no run happened: nothing it wrote is anyone's work) can take it back.

    Record it before the launch writes anything and `hold` the directory; `undo` then
    removes the entries the launch added to the directory, the directory itself if it did
    not exist, and the empty parent directories made for it: unless another live process
    uses the directory (see the module's docstring), when it removes nothing.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).expanduser().absolute()
        self.entries = set(os.listdir(self.path)) if self.path.is_dir() else None
        self.new_parents: list[Path] = []  # nearest first
        parent = self.path.parent
        while not parent.exists():
            self.new_parents.append(parent)
            parent = parent.parent
        self.use: RunDirUse | None = None

    def made(self, path: Path) -> "Footprint":
        """The same record for `path`, a new directory made inside the recorded one's parent."""
        self.path, self.entries = path, None
        return self

    def hold(self) -> "Footprint":
        """Use the directory (creating it) until `release`: another launch's `undo` leaves it alone.

        Raises:
            OSError: the directory or its lock file cannot be created.
        """
        self.use = RunDirUse(self.path).acquire()
        return self

    def undo(self) -> bool:
        """Remove what the launch added (local file operations; errors are ignored), if this
        process is the directory's only user; return whether it did."""
        if self.use is None or not self.use.alone():
            return False
        if self.entries is None:
            shutil.rmtree(self.path, ignore_errors=True)
        elif self.path.is_dir():
            for name in set(os.listdir(self.path)) - self.entries:
                entry = self.path / name
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
        for parent in self.new_parents:
            try:
                parent.rmdir()  # only while empty: the first one in use stops the climb
            except OSError:
                break
        return True

    def release(self) -> None:
        """Stop using the directory (after `undo`, if it ran)."""
        if self.use is not None:
            self.use.release()
            self.use = None
