"""Reading a DCP checkpoint without running code from it.

torch's own reader unpickles DCP's `.metadata` with `pickle.load` and loads the
byte items (an optimizer's `param_groups`, anything that is not a tensor) with
`torch.load(weights_only=False)`: a crafted file runs any code it names. Here:

- `.metadata` is read only once its digest matches clorch.json's
  (clorch.checkpoint.sharded_files), from the very descriptor that was hashed,
  by an unpickler that builds DCP's own metadata classes and the few torch
  values they hold (`METADATA_CLASSES`), and nothing else;
- its storage index may name only files clorch.json records (never a path
  outside the checkpoint);
- byte items are loaded with `torch.load(weights_only=True)`: tensors and plain
  containers of numbers, strings, bools and None.

A refusal is a `CheckpointError` naming the file (and the item).
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint._traverse import set_element

from clorch.checkpoint import archive
from clorch.checkpoint.errors import CheckpointError
from clorch.checkpoint.sharded_files import DCP_METADATA

_DCP = "torch.distributed.checkpoint"
METADATA_CLASSES = frozenset(
    {
        *(
            (f"{_DCP}.metadata", name)
            for name in (
                "Metadata",
                "MetadataIndex",
                "StorageMeta",
                "TensorProperties",
                "TensorStorageMetadata",
                "BytesStorageMetadata",
                "ChunkStorageMetadata",
                "_MEM_FORMAT_ENCODING",
            )
        ),
        (f"{_DCP}.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),  # a layout by its name
        ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id
        ("pathlib", "PurePosixPath"),
        ("collections", "OrderedDict"),
    }
)
"""(module, name) of everything a DCP `.metadata` may name; torch's dtypes (`torch.float32`, ...) too."""


class _MetadataUnpickler(pickle.Unpickler):
    """Builds `METADATA_CLASSES` and torch dtypes only: a `.metadata` naming anything else runs nothing."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in METADATA_CLASSES:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not one of DCP's metadata classes")


def read_metadata_file(directory: Path, files: dict[str, Any], marker: Path) -> Metadata:
    """DCP's `.metadata` in `directory`, verified against clorch.json's `files`, then safely unpickled.

    Its storage index may name only the recorded files: DCP opens `directory / name`.

    Raises:
        CheckpointError: missing, changed, not DCP metadata, naming anything but its classes,
            or storing an item in a file clorch.json does not record.
    """
    path = directory / DCP_METADATA
    entry = files[DCP_METADATA]
    fd = archive.open_archive(path, marker)
    try:
        archive.verify_open_archive(fd, path, entry, marker)
        data = os.pread(fd, entry["bytes"], 0)  # the very bytes that were hashed
    finally:
        os.close(fd)
    try:
        loaded = _MetadataUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # whatever a crafted pickle makes the unpickler raise; none ran code
        raise CheckpointError(
            f"refusing to load DCP metadata {path}: it is not DCP's metadata ({type(exc).__name__}: {exc}); "
            "clorch unpickles DCP's own classes only"
        ) from None
    if not isinstance(loaded, Metadata) or not isinstance(loaded.storage_data, dict):
        raise CheckpointError(f"refusing to load DCP metadata {path}: it holds no DCP metadata")
    for index, info in loaded.storage_data.items():
        name = getattr(info, "relative_path", None)
        if name not in files or name == DCP_METADATA:
            raise CheckpointError(
                f"refusing to load DCP metadata {path}: item {getattr(index, 'fqn', index)!r} is stored in "
                f"{name!r}, which {marker} does not record"
            )
    return loaded


def _load_plain(data: io.BytesIO, fqn: str, where: Path) -> Any:
    """`torch.load(weights_only=True)` of one byte item, or a CheckpointError naming it and its file."""
    try:
        return torch.load(data, weights_only=True)
    except Exception as exc:  # weights_only refuses any global it does not know; none ran
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise CheckpointError(
            f"refusing to load item {fqn!r} of {where}: it is not a plain value, torch.load(weights_only=True) "
            f"rejected it ({first}); clorch never loads with weights_only=False"
        ) from None


def check_byte_items(directory: Path, metadata: Metadata) -> None:
    """Load every byte item safely once, before DCP changes anything: a crafted one refuses the whole load.

    Local. The items are small (an optimizer's param_groups); each rank reads them all.

    Raises:
        CheckpointError: naming the item and its file.
    """
    byte_items = {fqn for fqn, meta in metadata.state_dict_metadata.items() if isinstance(meta, BytesStorageMetadata)}
    for index, info in metadata.storage_data.items():
        fqn = getattr(index, "fqn", None)
        if fqn not in byte_items:
            continue
        where = directory / info.relative_path
        if info.transform_descriptors:
            raise CheckpointError(
                f"item {fqn!r} of {where} is stored through {info.transform_descriptors}: not by clorch"
            )
        with open(where, "rb") as handle:
            handle.seek(info.offset)
            _load_plain(io.BytesIO(handle.read(info.length)), fqn, where)


class VerifiedReader(FileSystemReader):
    """torch's FileSystemReader, handing DCP the metadata `read_metadata_file` read and checked.

    Args:
        path: the checkpoint directory.
        metadata: its DCP metadata, from `read_metadata_file`.
    """

    def __init__(self, path: Path, metadata: Metadata) -> None:
        super().__init__(path)
        self._directory, self._metadata = Path(path), metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if getattr(self._metadata, "storage_meta", None) is None:
            self._metadata.storage_meta = StorageMeta()
        self._metadata.storage_meta.load_id = self.load_id
        return self._metadata

    def file_of(self, item: ReadItem) -> Path:
        """The file holding a read item (for the messages)."""
        info = self.storage_data.get(item.storage_index)
        return self._directory / str(getattr(info, "relative_path", "?"))


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, loading byte items with `torch.load(weights_only=True)`."""

    def __init__(self, reader: VerifiedReader) -> None:
        super().__init__()
        self._reader = reader

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        loaded = _load_plain(value, fqn, self._reader.file_of(read_item))
        if self.flatten_state_dict:  # as DefaultLoadPlanner.load_bytes puts it
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded


def as_checkpoint_error(exc: CheckpointException, path: Path) -> CheckpointError:
    """DCP's CheckpointException (a BaseException listing each rank's error) as one CheckpointError.

    A CheckpointError raised by the reader or planner above keeps its message.
    """
    failures = getattr(exc, "failures", {}) or {}
    for rank, pair in sorted(failures.items()):
        error = pair[0] if isinstance(pair, tuple) else pair
        if isinstance(error, CheckpointError):
            return CheckpointError(str(error))
    rank, pair = next(iter(sorted(failures.items())), (None, (exc, None)))
    error = pair[0] if isinstance(pair, tuple) else pair
    return CheckpointError(f"sharded checkpoint {path}: DCP failed to read it on rank {rank}: {error!r:.300}")
