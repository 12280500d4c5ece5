"""When to save, what to call it, which one to resume from, which ones to delete.

Checkpoints of a run live in one directory as `step_<step, 8+ digits>.ckpt`
(each with its `.tensors` archive beside it). Only names of exactly that form
are candidates: temporaries (`.step_....tmp`) and archives never are.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from clorch.checkpoint import metadata
from clorch._files import created_files
from clorch.checkpoint.api import CheckpointError, verify_checkpoint
from clorch.checkpoint.atomic import remove_quietly
import clorch.distributed as cdist
from clorch._args import int_arg as _int_arg
from clorch._checkpoint_names import step_checkpoint_path, step_checkpoints  # noqa: F401 (re-exported)

_LEFTOVER_NAME = re.compile(r"\.?step_(\d{8,})\.ckpt\..+\.(tensors|tmp)")


@dataclass(frozen=True)
class Latest:
    """The newest checkpoint that verified (None: none did), and the newer ones skipped, with why."""

    path: Path | None
    skipped: list[tuple[Path, str]]


def newest_verified(candidates: Iterable[Path], verify: Callable[[Path], object]) -> Latest:
    """The first of `candidates` (newest first) that `verify` accepts; the ones it refused, with its reason.

    `verify` raises CheckpointError or OSError (FileNotFoundError: deleted meanwhile) to refuse.
    """
    skipped = []
    for path in candidates:
        try:
            verify(path)
            return Latest(path, skipped)
        except (CheckpointError, OSError) as exc:
            skipped.append((path, str(exc)))
    return Latest(None, skipped)


def find_latest_checkpoint(directory: str | Path) -> Latest:
    """`newest_verified` over the step checkpoints in `directory`, by `verify_checkpoint`. Local."""
    return newest_verified((path for _, path in step_checkpoints(Path(directory))), verify_checkpoint)


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The newest step checkpoint in `directory` that passes `verify_checkpoint`, or None.

    A newer one that fails verification (corrupt, truncated, unsafe, archive
    missing) is skipped with a warning naming it and the reason. Local, not
    collective: each rank may call it (every call hashes the candidate it returns).
    """
    latest = find_latest_checkpoint(directory)
    for path, reason in latest.skipped:
        warnings.warn(f"skipping checkpoint {path}: {reason}", stacklevel=2)
    return latest.path


def _delete_checkpoint(path: Path) -> None:
    """Delete the metadata first (so it stops being a candidate), then its archives and temporaries."""
    remove_quietly(path)
    _delete_leftovers(path)


def _delete_leftovers(path: Path) -> None:
    for leftover in created_files(path.parent, f"{path.name}.", ".tensors") + created_files(
        path.parent, f".{path.name}.", ".tmp"
    ):
        remove_quietly(leftover)


def prune_checkpoints(directory: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` step checkpoints; return the deleted paths.

    Call it after save_checkpoint has returned, so the newest is committed.
    Leftovers of crashed saves (archives and temporaries named by no
    metadata) older than the newest kept checkpoint are deleted too.
    Only rank 0 deletes (every rank may call it; the others return []);
    not collective.

    Raises:
        TypeError / ValueError: keep_last is not an int >= 1.
    """
    keep_last = _int_arg("keep_last", keep_last, 1)
    if cdist.rank() != 0:
        return []
    directory = Path(directory)
    found = step_checkpoints(directory)
    removed = []
    for _, path in found[keep_last:]:
        _delete_checkpoint(path)
        removed.append(path)
    if found:
        _delete_orphans(directory, newest=found[0][0], kept=[p for _, p in found[:keep_last]])
    return removed


def _delete_orphans(directory: Path, newest: int, kept: list[Path]) -> None:
    """Archives and temporaries no kept metadata names, of steps older than the newest (never in progress)."""
    referenced = set()
    for path in kept:
        try:
            referenced.add(metadata.read(path)["archive"]["file"])
        except (CheckpointError, OSError):
            continue  # an unreadable checkpoint keeps its files; latest_checkpoint reports it
    for leftover in directory.glob("*step_*.ckpt.*"):
        match = _LEFTOVER_NAME.fullmatch(leftover.name)
        if match and int(match.group(1)) < newest and leftover.name not in referenced:
            remove_quietly(leftover)


def should_save(step: int, *, every_n_steps: int | None, epoch_end: bool, at_epoch_end: bool) -> bool:
    """Whether to save after optimizer step `step` (counted from 1).

    True when `every_n_steps` is set and divides `step`, or when this is the end
    of an epoch and `at_epoch_end` is set.

    Raises:
        TypeError / ValueError: step < 0 or every_n_steps < 1 (None disables step saves).
    """
    step = _int_arg("step", step, 0)
    if every_n_steps is not None:
        _int_arg("every_n_steps", every_n_steps, 1)
        if step > 0 and step % every_n_steps == 0:
            return True
    return bool(epoch_end and at_epoch_end)


@dataclass(frozen=True)
class CheckpointPolicy:
    """The engine's checkpoint settings in one value (`should_save` and `prune_checkpoints` do the work)."""

    every_n_steps: int | None = None
    """Save after every N optimizer steps; None: never on a step count."""
    at_epoch_end: bool = True
    """Save at the end of every epoch."""
    keep_last: int | None = None
    """Keep the newest K step checkpoints, delete older ones after each save; None keeps all."""

    def __post_init__(self) -> None:
        if self.every_n_steps is not None:
            _int_arg("every_n_steps", self.every_n_steps, 1)
        if self.keep_last is not None:
            _int_arg("keep_last", self.keep_last, 1)
        if not isinstance(self.at_epoch_end, bool):
            raise TypeError(f"at_epoch_end must be a bool, got {self.at_epoch_end!r}")

    def should_save(self, step: int, *, epoch_end: bool) -> bool:
        """`should_save(step, ...)` with this policy's settings."""
        return should_save(step, every_n_steps=self.every_n_steps, epoch_end=epoch_end, at_epoch_end=self.at_epoch_end)

    def prune(self, directory: str | Path) -> list[Path]:
        """`prune_checkpoints(directory, keep_last)`, or nothing when keep_last is None."""
        return [] if self.keep_last is None else prune_checkpoints(directory, self.keep_last)


__all__ = [
    "CheckpointPolicy",
    "Latest",
    "find_latest_checkpoint",
    "latest_checkpoint",
    "newest_verified",
    "prune_checkpoints",
    "should_save",
    "step_checkpoint_path",
]
