"""The digests of a sharded checkpoint's files: recorded when it is saved, verified before it is read.

DCP writes `.metadata` and one `__<rank>_<n>.distcp` file per rank; clorch.json
records, for every one of them, what a `.ckpt` archive's metadata records for
its archive: its size and the XXH3-128 digest of each block of
`clorch.checkpoint.archive.BLOCK_BYTES` (`files`, name -> entry). A directory
is loaded only when its files are exactly the recorded ones (none missing,
none extra) and every block matches: a flipped bit, a truncated shard, or a
shard of another step (another save's bytes) is refused, naming the file,
before DCP reads anything.

The work is split over the ranks (rank r hashes the r-th, (r + W)-th, ...
file in name order), since each file is read once whichever rank reads it;
`clorch.checkpoint.collective` then makes every rank agree.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from clorch.checkpoint import archive, metadata
from clorch.checkpoint.atomic import open_regular
from clorch.checkpoint.errors import CheckpointError

DCP_METADATA = ".metadata"
"""DCP's index of a checkpoint: a pickle, read only after its digest checks (clorch.checkpoint.dcp_read)."""


def files_of(directory: Path, marker: str) -> list[str]:
    """The names in `directory` but the marker, sorted: the files DCP wrote there."""
    return sorted(entry.name for entry in directory.iterdir() if entry.name != marker)


def my_share(names: list[str], rank: int, world_size: int) -> list[str]:
    """The files this rank hashes or verifies: every `world_size`-th, from the `rank`-th."""
    return names[rank::world_size]


def file_entry(path: Path) -> dict[str, Any]:
    """Size and block digests of the file at `path` (a clorch.json `files` entry).

    Raises:
        CheckpointError: it is not a regular file.
        OSError: it cannot be read.
    """
    fd = open_regular(path, "sharded checkpoint file")
    try:
        size = os.fstat(fd).st_size
        blocks = archive.hash_blocks(fd, size, archive.BLOCK_BYTES)
    finally:
        os.close(fd)
    return {
        "bytes": size,
        "block_bytes": archive.BLOCK_BYTES,
        "hash": archive.HASH,
        "block_digests": blocks,
        "digest": archive.root_digest(blocks),
    }


def check_files_field(path: Path, files: Any) -> None:
    """Check clorch.json's `files` field: plain names, DCP's .metadata among them, well-formed entries.

    Raises:
        CheckpointError: naming the field, what it holds and what is allowed.
    """
    marker = path / "clorch.json"
    if not isinstance(files, dict) or DCP_METADATA not in files:
        raise CheckpointError(
            f"sharded checkpoint {path}: {marker} records no digests of DCP's files (field 'files' is "
            f"{str(files)[:80]!r}, expected a dict with {DCP_METADATA!r}); clorch loads no checkpoint "
            "unverified: re-save it with this clorch"
        )
    for name, entry in files.items():
        # A name with a separator could point outside the checkpoint.
        if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
            raise CheckpointError(f"sharded checkpoint {path}: {marker} names {name!r}, not a plain file name")
        entry = {"file": name, **entry} if isinstance(entry, dict) else entry
        metadata.check_archive(marker, entry, 2, field=f"files[{name!r}]")


def check_listing(path: Path, files: dict[str, Any], marker: str) -> None:
    """The directory holds exactly the recorded files (a missing shard, or one that is not this save's).

    Raises:
        CheckpointError: naming the missing or unrecorded files.
    """
    present = set(files_of(path, marker))
    missing, extra = sorted(set(files) - present), sorted(present - set(files))
    if missing:
        raise CheckpointError(
            f"sharded checkpoint {path} is incomplete: {', '.join(str(path / n) for n in missing)} "
            f"recorded in its {marker} is missing"
        )
    if extra:
        raise CheckpointError(
            f"sharded checkpoint {path} holds files its {marker} does not record: "
            f"{', '.join(str(path / n) for n in extra)} (not written by this save: remove them, or "
            "copy the checkpoint whole)"
        )


def verify_file(path: Path, name: str, entry: dict[str, Any], marker: str) -> None:
    """Check one file's size and every block against its entry.

    Raises:
        CheckpointError: missing, not a regular file, truncated or extended, or a block differs
            (the message names the file).
    """
    fd = archive.open_archive(path / name, path / marker)
    try:
        archive.verify_open_archive(fd, path / name, entry, path / marker)
    finally:
        os.close(fd)


def verify_files(path: Path, files: dict[str, Any], marker: str, rank: int = 0, world_size: int = 1) -> None:
    """The listing, then this rank's share of the files (all of them for rank 0 of 1). Local.

    Raises:
        CheckpointError: the first problem found, naming the file.
    """
    check_listing(path, files, marker)
    for name in my_share(sorted(files), rank, world_size):
        verify_file(path, name, files[name], marker)
