"""The sweep directory: one sweep at a time in it, and the same sweep when it is continued.

A sweep holds an exclusive lock on SWEEP_DIR/.sweep.lock (`fcntl.flock`) for its whole
life; the operating system drops it however the sweep ends (SIGKILL included), so a
lock is never left behind. A second sweep into a directory in use is refused at once.

When it starts, a sweep writes what it is into SWEEP_DIR/sweep.json: its sweeper, its
overrides (the searched keys and the fixed ones), its objective and direction, and its
study. Running a sweep into a directory that holds another one (another search space,
`epochs=4` over an `epochs=2` sweep, another objective) is refused with the difference
named, since its finished trials would be taken for the new sweep's; with
`hydra.sweeper.continue_changed=true` it continues all the same (sweep.json then
records the new sweep). `n_trials`, `n_jobs`, the sampler and the pruner may change
freely: a continued sweep may ask for more trials, or ask them another way.
Standard library only.
"""

from __future__ import annotations

import fcntl
import json
import os
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from clorch.sweep.errors import SweepRefused

LOCK_FILE = ".sweep.lock"
IDENTITY_FILE = "sweep.json"
IDENTITY_FILE_TMP = f".{IDENTITY_FILE}.tmp"  # written, then renamed over IDENTITY_FILE
BEST_FILE = "best.yaml"  # the best trial as a recipe (clorch.sweep.best)
PARETO_PLOT = "sweep_pareto.png"  # several objectives: their Pareto front (clorch.sweep.report)
# What a sweep writes into its directory at its end besides the files clorch-train's check of a sweep
# directory knows already (the summary, the plots of one objective): a continued sweep finds them there.
SWEEP_END_FILES = (BEST_FILE, PARETO_PLOT)


class SweepLock:
    """The exclusive lock of one sweep directory, held from `acquire` to `release` (or the
    process's end)."""

    def __init__(self, sweep_dir: Path) -> None:
        self.path = sweep_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise SweepRefused at once: another sweep runs in the directory."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:  # a symbolic link (ELOOP), a read-only directory
            raise SweepRefused(
                [f"cannot lock {self.path}: {exc.strerror}; a sweep needs a directory of its own"]
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
            os.close(fd)
            raise SweepRefused(
                [
                    f"hydra.sweep.dir={self.path.parent} is in use by another sweep (process {holder or '?'}, "
                    "which holds its lock): wait for it to end, or choose another hydra.sweep.dir"
                ]
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None


@dataclass
class SweepIdentity:
    """What makes a sweep the same sweep: what SWEEP_DIR/sweep.json records."""

    sweeper: str  # basic or optuna
    overrides: dict[str, str]  # {key: value as typed, or a searched key's space}, in the command's order
    objective: str | list[str] | None = None  # the Optuna sweeper's (a list: several); null for the grid
    direction: str | list[str] | None = None
    study: dict[str, Any] = field(default_factory=dict)  # the Optuna sweeper's study: name, storage
    uid: str = ""  # this sweep's own id, also in its study (a study copied in from another sweep has another)

    @classmethod
    def read(cls, sweep_dir: Path) -> "SweepIdentity | None":
        """The identity recorded in `sweep_dir`, or None (a new directory, or an older clorch's sweep)."""
        path = sweep_dir / IDENTITY_FILE
        try:
            data = json.loads(path.read_text())
            return cls(**data)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as exc:
            raise SweepRefused(
                [f"{path} is not a sweep record clorch wrote ({exc}): move it aside, or choose another hydra.sweep.dir"]
            ) from None

    def write(self, sweep_dir: Path) -> None:
        path = sweep_dir / IDENTITY_FILE
        if path.is_symlink():
            raise SweepRefused([f"{path} is a symbolic link: a sweep writes only inside its directory"])
        temporary = path.with_name(IDENTITY_FILE_TMP)
        temporary.write_text(json.dumps(asdict(self), indent=2) + "\n")
        os.replace(temporary, path)

    def differences(self, before: "SweepIdentity") -> list[str]:
        """Each way this sweep differs from the one recorded `before`, as a phrase."""
        found = []
        for name in ("sweeper", "objective", "direction"):
            if getattr(self, name) != getattr(before, name):
                found.append(f"{name} {getattr(before, name)} before, {getattr(self, name)} now")
        found += _override_differences(before.overrides, self.overrides)
        if self.study.get("name") != before.study.get("name"):
            found.append(f"study_name {before.study.get('name')} before, {self.study.get('name')} now")
        return found


def _override_differences(before: dict[str, str], now: dict[str, str]) -> list[str]:
    found = []
    for key in [*before, *(k for k in now if k not in before)]:
        if key not in now:
            found.append(f"{key}={before[key]} before, not set now")
        elif key not in before:
            found.append(f"{key}={now[key]} now, not set before")
        elif before[key] != now[key]:
            found.append(f"{key}={before[key]} before, {key}={now[key]} now")
    if not found and list(before) != list(now):
        found.append(f"the overrides' order (which numbers the grid's trials): {' '.join(before)} before")
    return found


def check_identity(sweep_dir: Path, identity: SweepIdentity, continue_changed: bool) -> list[str]:
    """Refuse a sweep other than the one `sweep_dir` holds (SweepRefused, naming each difference),
    unless `continue_changed`; record `identity` there. Returns the differences continued over.

    The caller holds the directory's lock (SweepLock).
    """
    before = SweepIdentity.read(sweep_dir)
    identity.uid = before.uid if before is not None and before.uid else uuid.uuid4().hex
    changes = [] if before is None else identity.differences(before)
    if changes and not continue_changed:
        raise SweepRefused(
            [
                f"hydra.sweep.dir={sweep_dir} holds another sweep, whose finished trials would be taken for "
                f"this one's: {'; '.join(changes)}. Choose another hydra.sweep.dir, run the same sweep as "
                "before, or add hydra.sweeper.continue_changed=true to continue it with these changes"
            ]
        )
    if before is None or changes or not before.uid:
        identity.write(sweep_dir)
    return changes


def finished_trial_dirs(sweep_dir: Path) -> list[str]:
    """The names of the numbered trial directories in `sweep_dir` that hold a summary.json."""
    found = [p for p in sweep_dir.iterdir() if p.name.isdigit() and (p / "summary.json").is_file()]
    return [p.name for p in sorted(found, key=lambda p: int(p.name))]
