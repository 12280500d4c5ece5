"""The metadata file: JSON, self-checksummed, the commit point of a checkpoint.

Layout (one JSON object, keys sorted):

    format, format_version     "clorch-checkpoint", 1
    clorch_version, torch_version, created (UTC, ISO 8601), world_size
    state                      the training state passed to save_checkpoint
    archive                    file (name beside this one), bytes, block_bytes,
                               block_sha256 (list), sha256 (of the block digests)
    contents                   which of model/optimizer/scaler the archive holds
    samplers                   every rank's sampler state (null where none)
    rng                        every rank's RNG states (see clorch.checkpoint.rng)
    checksum                   sha256 of the canonical JSON of everything else

It is parsed with `json` only: reading it runs no code.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from pathlib import Path
from typing import Any

from clorch.checkpoint.archive import CheckpointError

FORMAT = "clorch-checkpoint"
FORMAT_VERSION = 1
# A metadata file is small (tens of KiB); refuse to slurp a large file passed by mistake.
_MAX_METADATA_BYTES = 64 << 20
_ARCHIVE_KEYS = ("file", "bytes", "block_bytes", "block_sha256", "sha256")
_REQUIRED = ("format", "format_version", "world_size", "state", "archive", "contents",
             "samplers", "rng", "checksum")


def check_json_state(value: Any, where: str = "state") -> None:
    """Raise TypeError naming the first value JSON cannot round-trip.

    Allowed: dicts with str keys, lists, tuples (they come back as lists),
    str, int, float, bool, None. NaN and infinities (a diverged loss) are
    written as Python's json writes them (NaN, Infinity) and read back as such.
    """
    if value is None or isinstance(value, (str, bool, int, float)):
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where} keys must be str to be saved as JSON, got {key!r} "
                                f"({type(key).__name__})")
            check_json_state(item, f"{where}[{key!r}]")
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_json_state(item, f"{where}[{index}]")
        return
    raise TypeError(
        f"{where} must be JSON-serializable (dict with str keys, list, tuple, str, int, float, "
        f"bool, None), got {type(value).__name__}: store tensors in the model or optimizer instead")


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=True).encode()


def encode(body: dict[str, Any]) -> bytes:
    """The metadata file's bytes: `body` plus its checksum, as readable JSON."""
    full = dict(body, checksum=hashlib.sha256(_canonical(body)).hexdigest())
    return json.dumps(full, sort_keys=True, indent=1, ensure_ascii=True, allow_nan=True).encode() + b"\n"


def new_body(*, versions: dict[str, str], world_size: int, state: dict[str, Any],
             archive: dict[str, Any], contents: dict[str, bool], samplers: list[Any],
             rng: list[Any]) -> dict[str, Any]:
    """The metadata of a new checkpoint (everything but its checksum)."""
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "created": created,
            "world_size": world_size, "state": state, "archive": archive, "contents": contents,
            "samplers": samplers, "rng": rng, **versions}


def read(path: Path) -> dict[str, Any]:
    """Parse and check the metadata file at `path`; return it without its checksum.

    Raises:
        FileNotFoundError: nothing at `path`.
        CheckpointError: not JSON, not a clorch checkpoint, a newer format, a
            missing field, or a checksum that does not match (corrupt file).
    """
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(_MAX_METADATA_BYTES + 1)
    except FileNotFoundError:
        raise FileNotFoundError(f"no checkpoint at {path}") from None
    except IsADirectoryError:
        raise CheckpointError(f"checkpoint path {path} is a directory, expected a metadata file") from None
    if raw.startswith(b"PK") or len(raw) > _MAX_METADATA_BYTES:
        raise CheckpointError(f"{path} is not a clorch checkpoint metadata file (it looks like a "
                              "tensor archive or another large file): pass the path given to save_checkpoint")
    try:
        full = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint metadata {path} is corrupt (not valid JSON: {exc})") from None
    if not isinstance(full, dict) or full.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a clorch checkpoint (format is not {FORMAT!r})")
    missing = [key for key in _REQUIRED if key not in full]
    if missing:
        raise CheckpointError(f"checkpoint metadata {path} is corrupt: missing fields {missing}")
    body = {key: value for key, value in full.items() if key != "checksum"}
    if hashlib.sha256(_canonical(body)).hexdigest() != full["checksum"]:
        raise CheckpointError(f"checkpoint metadata {path} is corrupt: its checksum does not match its content")
    version = body["format_version"]
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} has format_version {version!r}; this clorch reads "
                              f"up to {FORMAT_VERSION}: upgrade clorch")
    _check_archive_entry(path, body["archive"])
    return body


def _check_archive_entry(path: Path, archive: Any) -> None:
    if not isinstance(archive, dict) or any(key not in archive for key in _ARCHIVE_KEYS):
        raise CheckpointError(f"checkpoint metadata {path} is corrupt: 'archive' needs {list(_ARCHIVE_KEYS)}")
    name = archive["file"]
    # The archive must sit beside the metadata: a name with a separator could point anywhere.
    if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
        raise CheckpointError(f"checkpoint metadata {path} names an invalid archive file {name!r}")


def archive_path(metadata_path: Path, body: dict[str, Any]) -> Path:
    """Where the archive named by the metadata at `metadata_path` lives (beside it)."""
    return Path(metadata_path).parent / body["archive"]["file"]
