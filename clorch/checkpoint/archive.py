"""The tensor archive: `torch.save`'s zip format, hashed while it is written, verified before it is read.

Checksum: the archive is cut into blocks of `BLOCK_BYTES`; the metadata keeps
the digest of every block and `digest`, the digest of the concatenated block
digests (a one-level hash list), under the hash named by `hash`.

The hash is XXH3-128 (`xxhash`), chosen for the threat it faces: corruption
(a flipped bit, a torn or truncated write, a file swapped for another), not an
attacker, since `torch.load(weights_only=True)` already refuses hostile
content. A 128-bit non-cryptographic hash misses a random corruption with
probability about 2**-128 per block, and runs at 20+ GB/s on one core,
against about 1.8 GB/s for sha256, which made hashing the bottleneck of
saving and loading. (CRC32C, the other candidate, is slower from Python and
only 32 bits.) Checkpoints written with sha256 (format_version 1) are still
verified with sha256.

Blocks are independent, so on a machine with 4 or more cores they are hashed
on several threads while the main thread writes, and verified on several
threads on load. With fewer cores they are hashed inline, as the bytes stream out.

Reading: the blocks are hashed from a read-only mmap of the file, then the
same file (pinned by its descriptor) is opened by `torch.load(weights_only=True,
mmap=True)`, so the tensors are views of the page cache rather than a second
in-memory copy. Nothing here ever calls `torch.load` with weights_only=False.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import pickle
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import xxhash

from clorch import _files
from clorch.checkpoint import atomic
from clorch.checkpoint.errors import CheckpointError

BLOCK_BYTES = 4 << 20
HASH = "xxh3_128"
"""The hash new archives are written with."""
HASHES = {"xxh3_128": xxhash.xxh3_128, "sha256": hashlib.sha256}
"""Hashes archives can be verified with (sha256: checkpoints of format_version 1)."""
# Writes smaller than this are hashed inline: handing them to a thread costs more than it saves.
_PARALLEL_MIN_BYTES = 1 << 20


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# Hashing threads beside the writing thread. With few cores (2 or 3) every
# byte is hashed inline instead: there the threads would only compete with
# the writer, and waking them on a busy machine costs more than it saves.
_HASH_THREADS = min(8, _usable_cpus() - 1)
_PARALLEL = _HASH_THREADS >= 2
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_HASH_THREADS, thread_name_prefix="clorch-hash")
        return _pool


class HashingWriter:
    """A write-only file object: every byte goes to `fd` and into its block's hash (`HASH`).

    `torch.save` only calls `write` and `flush`. Each large write is split at
    block boundaries and each piece hashed on a pool thread while this thread
    writes the bytes; `write` returns only when both are done, because torch
    may reuse the buffer afterwards.

    torch.save turns an OSError raised by `write` into a RuntimeError that has
    lost its errno (ENOSPC: disk full), so the first one is kept in `error`
    for the caller to re-raise, and every later write fails the same way.
    """

    def __init__(self, fd: int, block_bytes: int = BLOCK_BYTES) -> None:
        self._fd = fd
        self._block_bytes = block_bytes
        self._new_hasher = HASHES[HASH]
        self._hashers = [self._new_hasher()]
        self._filled = 0  # bytes in the current (last) block
        self.written = 0
        self.error: OSError | None = None

    def _pieces(self, view: memoryview) -> list[tuple[Any, memoryview]]:
        pieces = []
        while view.nbytes:
            if self._filled == self._block_bytes:
                self._hashers.append(self._new_hasher())
                self._filled = 0
            take = min(view.nbytes, self._block_bytes - self._filled)
            pieces.append((self._hashers[-1], view[:take]))
            self._filled += take
            view = view[take:]
        return pieces

    def write(self, data: Any) -> int:
        if self.error is not None:
            raise self.error
        view = memoryview(data).cast("B")
        pieces = self._pieces(view)
        futures: list[Future] = []
        if _PARALLEL and view.nbytes >= _PARALLEL_MIN_BYTES:
            futures = [_executor().submit(hasher.update, piece) for hasher, piece in pieces]
        else:
            for hasher, piece in pieces:
                hasher.update(piece)
        try:
            _files.write_all(self._fd, view)
        except OSError as exc:
            self.error = exc
            raise
        finally:
            for future in futures:  # the pool must be done with `data` before torch reuses it
                future.result()
        self.written += view.nbytes
        return view.nbytes

    def flush(self) -> None:
        """Nothing is buffered here; durability comes from the caller's fsync."""

    def digests(self) -> list[str]:
        return [hasher.hexdigest() for hasher in self._hashers] if self.written else []


def root_digest(block_digests: list[str], algorithm: str = HASH) -> str:
    """The archive's digest: the hash of its block digests, concatenated as bytes."""
    return HASHES[algorithm](b"".join(bytes.fromhex(d) for d in block_digests)).hexdigest()


def checksums(info: dict[str, Any], path: Path, metadata_path: Path) -> tuple[str, list[str], str]:
    """(hash name, block digests, root digest) of a metadata "archive" entry, either format.

    Raises:
        CheckpointError: the entry lacks them (missing or null: nothing to verify the
            archive `path` against; clorch never loads an archive unverified).
    """
    if "hash" in info:
        found = info.get("hash"), info.get("block_digests"), info.get("digest")
    else:  # format_version 1
        found = "sha256", info.get("block_sha256"), info.get("sha256")
    algorithm, blocks, digest = found
    if (
        algorithm not in HASHES
        or not isinstance(blocks, list)
        or not isinstance(digest, str)
        or not all(isinstance(block, str) for block in blocks)
    ):
        raise CheckpointError(
            f"refusing to load checkpoint archive {path} unverified: its metadata {metadata_path} "
            "records no usable block checksums (a missing or null hash, block digests or digest)"
        )
    return algorithm, blocks, digest


def _save(fd: int, obj: dict[str, Any]) -> HashingWriter:
    """`torch.save(obj)` through a HashingWriter on `fd`, then fsync; the writer's own OSError wins."""
    writer = HashingWriter(fd)
    crc = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(obj, writer)
    except Exception:
        if writer.error is not None:  # torch wrapped it: give the caller the errno back
            raise writer.error from None
        raise
    finally:
        torch.serialization.set_crc32_options(crc)
    os.fsync(fd)
    return writer


def write_archive(directory: Path, prefix: str, obj: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """`torch.save(obj)` into a new file `<prefix><random>.tensors` in `directory`, fsynced.

    The file is created exclusively (never an existing file or symlink).
    torch's own zip CRC32s are switched off while writing: torch.load does not
    check them and the hashed blocks cover every byte, so they would be wasted
    work (the setting is restored afterwards).

    Returns:
        The archive's path, and its size and checksums (the metadata's "archive" entry, less "file").

    Raises:
        OSError: the write or the fsync failed, e.g. errno ENOSPC (the partial file is removed).
    """
    fd, path = _files.create_exclusive(directory, prefix, ".tensors", 0o644)
    try:
        try:
            writer = _save(fd, obj)
        finally:
            os.close(fd)
    except BaseException:
        atomic.remove_quietly(path)
        raise
    blocks = writer.digests()
    return path, {
        "bytes": writer.written,
        "block_bytes": BLOCK_BYTES,
        "hash": HASH,
        "block_digests": blocks,
        "digest": root_digest(blocks),
    }


def hash_blocks(fd: int, size: int, block_bytes: int, algorithm: str = HASH) -> list[str]:
    """The digest of each `block_bytes` block of the open file `fd` (`size` bytes), on the pool's threads."""
    if size == 0:
        return []
    new_hasher = HASHES[algorithm]
    with mmap.mmap(fd, size, prot=mmap.PROT_READ) as mapped:
        view = memoryview(mapped)
        try:

            def one(start: int) -> str:
                return new_hasher(view[start : start + block_bytes]).hexdigest()

            starts = range(0, size, block_bytes)
            return list(_executor().map(one, starts)) if _PARALLEL else [one(i) for i in starts]
        finally:
            view.release()


def verify_open_archive(fd: int, path: Path, info: dict[str, Any], metadata_path: Path) -> None:
    """Check size, then every block's digest, of the archive open as `fd`.

    Raises:
        CheckpointError: no checksums to check against, truncated or extended (size
            differs), or a block differs.
    """
    algorithm, blocks, digest = checksums(info, path, metadata_path)
    size = os.fstat(fd).st_size
    if size != info["bytes"]:
        raise CheckpointError(
            f"checkpoint archive {path} is truncated or was changed: it has {size} bytes, "
            f"its metadata {metadata_path} records {info['bytes']}"
        )
    found = hash_blocks(fd, size, info["block_bytes"], algorithm)
    for index, (got, want) in enumerate(zip(found, blocks)):
        if got != want:
            start = index * info["block_bytes"]
            raise CheckpointError(
                f"checkpoint archive {path} is corrupt: {algorithm} of bytes [{start}, "
                f"{min(start + info['block_bytes'], size)}) is {got}, its metadata "
                f"{metadata_path} records {want}"
            )
    if len(found) != len(blocks) or root_digest(found, algorithm) != digest:
        raise CheckpointError(f"checkpoint archive {path} does not match the checksum in {metadata_path}")


def open_archive(path: Path, metadata_path: Path) -> int:
    """Open the archive read-only and return its descriptor.

    Raises:
        CheckpointError: the archive the metadata names is missing, or is not
            a regular file (a FIFO there would otherwise block the load forever).
    """
    try:
        return atomic.open_regular(path, "checkpoint archive")
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint archive {path}, named by {metadata_path}, is missing") from None


def load_verified(fd: int, path: Path) -> Any:
    """`torch.load(weights_only=True, mmap=True)` of the (already verified) archive open as `fd`.

    Raises:
        CheckpointError: the archive holds anything but tensors and plain
            containers (e.g. a pickle that would run code), or is not a torch archive.
    """
    # /proc/self/fd pins the very inode that was hashed, even if the path is replaced meanwhile.
    source = f"/proc/self/fd/{fd}" if os.path.exists(f"/proc/self/fd/{fd}") else os.fspath(path)
    try:
        return torch.load(source, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"refusing to load {path}: it is not a plain tensor archive, torch.load(weights_only=True) "
            f"rejected it ({first}); clorch never loads with weights_only=False, so re-save it "
            "from trusted code"
        ) from None
    except (RuntimeError, ValueError, OSError, EOFError) as exc:
        raise CheckpointError(f"checkpoint archive {path} cannot be read as a torch archive: {exc}") from None


def read_archive(path: Path, info: dict[str, Any], metadata_path: Path) -> Any:
    """Verify the archive against `info` (from the metadata), then load it safely.

    Raises:
        CheckpointError: missing, truncated, corrupt or unsafe (see the helpers).
    """
    fd = open_archive(path, metadata_path)
    try:
        verify_open_archive(fd, path, info, metadata_path)
        return load_verified(fd, path)
    finally:
        os.close(fd)
