"""The metadata file: JSON, self-checksummed, the commit point of a checkpoint.

Layout (one JSON object, keys sorted):

    format, format_version     "clorch-checkpoint", 2
    clorch_version, torch_version, created (UTC, ISO 8601), world_size
    state                      the training state passed to save_checkpoint
    archive                    file (name beside this one), bytes, block_bytes,
                               hash ("xxh3_128"), block_digests (list),
                               digest (of the block digests)
                               (format_version 1: block_sha256 and sha256, no hash)
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
import os
import re
from pathlib import Path
from typing import Any

from clorch.checkpoint.atomic import open_regular
from clorch.checkpoint.errors import CheckpointError
from clorch.checkpoint.rng import rng_state_problem

FORMAT = "clorch-checkpoint"
FORMAT_VERSION = 2
# A metadata file is small (tens of KiB); refuse to slurp a large file passed by mistake.
_MAX_METADATA_BYTES = 64 << 20
_ARCHIVE_KEYS = {
    1: ("file", "bytes", "block_bytes", "block_sha256", "sha256"),
    2: ("file", "bytes", "block_bytes", "hash", "block_digests", "digest"),
}
_HEX_DIGEST = {"sha256": re.compile(r"[0-9a-f]{64}"), "xxh3_128": re.compile(r"[0-9a-f]{32}")}
_REQUIRED = ("format", "format_version", "world_size", "state", "archive", "contents", "samplers", "rng", "checksum")
_OPTIONAL_TEXT = ("created", "clorch_version", "torch_version")
_COMPONENTS = ("model", "optimizer", "scaler")


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
                raise TypeError(f"{where} keys must be str to be saved as JSON, got {key!r} ({type(key).__name__})")
            check_json_state(item, f"{where}[{key!r}]")
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_json_state(item, f"{where}[{index}]")
        return
    raise TypeError(
        f"{where} must be JSON-serializable (dict with str keys, list, tuple, str, int, float, "
        f"bool, None), got {type(value).__name__}: store tensors in the model or optimizer instead"
    )


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True).encode()


def encode(body: dict[str, Any]) -> bytes:
    """The metadata file's bytes: `body` plus its checksum, as readable JSON."""
    full = dict(body, checksum=hashlib.sha256(_canonical(body)).hexdigest())
    return json.dumps(full, sort_keys=True, indent=1, ensure_ascii=True, allow_nan=True).encode() + b"\n"


def new_body(
    *,
    versions: dict[str, str],
    world_size: int,
    state: dict[str, Any],
    archive: dict[str, Any],
    contents: dict[str, bool],
    samplers: list[Any],
    rng: list[Any],
) -> dict[str, Any]:
    """The metadata of a new checkpoint (everything but its checksum)."""
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created": created,
        "world_size": world_size,
        "state": state,
        "archive": archive,
        "contents": contents,
        "samplers": samplers,
        "rng": rng,
        **versions,
    }


def _read_json(path: Path) -> Any:
    """The parsed JSON at `path` (any JSON value).

    Raises:
        FileNotFoundError: nothing at `path`.
        CheckpointError: not a regular file (a FIFO, a directory...), too
            large or a tensor archive, or not JSON.
    """
    try:
        fd = open_regular(path, "checkpoint path")
    except FileNotFoundError:
        raise FileNotFoundError(f"no checkpoint at {path}") from None
    with os.fdopen(fd, "rb") as handle:
        raw = handle.read(_MAX_METADATA_BYTES + 1)
    if raw.startswith(b"PK") or len(raw) > _MAX_METADATA_BYTES:
        raise CheckpointError(
            f"{path} is not a clorch checkpoint metadata file (it looks like a "
            "tensor archive or another large file): pass the path given to save_checkpoint"
        )
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: absurd nesting
        raise CheckpointError(f"checkpoint metadata {path} is corrupt (not valid JSON: {exc})") from None


def is_checkpoint(path: Path) -> bool:
    """Whether `path` is a regular file holding JSON that declares itself clorch checkpoint metadata.

    Only the format marker is checked, not the checksum: a damaged checkpoint
    is still ours to replace, while any other file is someone else's.

    Raises:
        FileNotFoundError: nothing at `path`.
        OSError: it cannot be read (e.g. permissions).
    """
    try:
        full = _read_json(Path(path))
    except CheckpointError:
        return False
    return isinstance(full, dict) and full.get("format") == FORMAT


def read(path: Path) -> dict[str, Any]:
    """Parse and check the metadata file at `path`; return it without its checksum.

    Every field is checked (`validate`), so code that uses the result may
    index and compute with it without further checks.

    Raises:
        FileNotFoundError: nothing at `path`.
        CheckpointError: not a regular file, not JSON, not a clorch checkpoint,
            a newer format, a missing or malformed field, or a checksum that does
            not match (corrupt file).
    """
    path = Path(path)
    full = _read_json(path)
    if not isinstance(full, dict) or full.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a clorch checkpoint (format is not {FORMAT!r})")
    missing = [key for key in _REQUIRED if key not in full]
    if missing:
        raise CheckpointError(f"checkpoint metadata {path} is corrupt: missing fields {missing}")
    body = {key: value for key, value in full.items() if key != "checksum"}
    if hashlib.sha256(_canonical(body)).hexdigest() != full["checksum"]:
        raise CheckpointError(f"checkpoint metadata {path} is corrupt: its checksum does not match its content")
    validate(path, body)
    return body


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _malformed(path: Path, field: str, value: Any, allowed: str) -> CheckpointError:
    return CheckpointError(
        f"checkpoint metadata {path} is corrupt: field {field!r} is {_shown(value)}, expected {allowed}"
    )


def _check_int(path: Path, field: str, value: Any, minimum: int) -> None:
    if type(value) is not int or value < minimum:  # type(): True is an int to isinstance
        raise _malformed(path, field, value, f"an int >= {minimum}")


def _check_list(path: Path, field: str, value: Any, length: int) -> None:
    if not isinstance(value, list) or len(value) != length:
        raise _malformed(path, field, value, f"a list of {length} entries (one per rank of world_size {length})")


def check_archive(path: Path, archive: Any, version: int, field: str = "archive") -> None:
    """Check an archive entry (size, block size, hash and digests) of `version`; `field` names it in errors.

    Raises:
        CheckpointError: naming the first malformed key, its value and what is allowed.
    """
    keys = _ARCHIVE_KEYS[version]
    if not isinstance(archive, dict) or any(key not in archive for key in keys):
        raise _malformed(path, field, archive, f"a dict with {list(keys)}")
    # The other format's checksum fields would make the reader verify against fields not checked here.
    foreign = sorted(
        key for version_keys in _ARCHIVE_KEYS.values() for key in version_keys if key not in keys and key in archive
    )
    if foreign:
        raise _malformed(
            path, field, archive, f"a dict with {list(keys)} and none of {foreign} (format_version {version})"
        )
    name = archive["file"]
    # The archive must sit beside the metadata: a name with a separator could point anywhere.
    if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
        raise _malformed(path, f"{field}.file", name, "a file name without directory parts")
    _check_int(path, f"{field}.bytes", archive["bytes"], 0)
    _check_int(path, f"{field}.block_bytes", archive["block_bytes"], 1)
    if version == 1:
        algorithm, blocks_key, digest_key = "sha256", "block_sha256", "sha256"
    else:
        algorithm, blocks_key, digest_key = archive["hash"], "block_digests", "digest"
        if not isinstance(algorithm, str) or algorithm not in _HEX_DIGEST:
            raise _malformed(path, f"{field}.hash", algorithm, f"one of {sorted(_HEX_DIGEST)}")
    pattern = _HEX_DIGEST[algorithm]
    blocks = -(-archive["bytes"] // archive["block_bytes"])
    digests = archive[blocks_key]
    if (
        not isinstance(digests, list)
        or len(digests) != blocks
        or not all(isinstance(d, str) and pattern.fullmatch(d) for d in digests)
    ):
        raise _malformed(
            path,
            f"{field}.{blocks_key}",
            digests,
            f"a list of {blocks} {algorithm} hex digests (bytes / block_bytes, rounded up)",
        )
    if not isinstance(archive[digest_key], str) or not pattern.fullmatch(archive[digest_key]):
        raise _malformed(path, f"{field}.{digest_key}", archive[digest_key], f"a {algorithm} hex digest")


def validate(path: Path, body: dict[str, Any]) -> None:
    """Check every field of a metadata body (its checksum already matched); the one place that does.

    A checksum only proves the file is as written, not that a writer (an
    older or foreign one) wrote sensible values; the loader indexes and
    divides by these, so each is checked here once.

    Raises:
        CheckpointError: naming the first malformed field, its value and what is allowed.
    """
    version = body["format_version"]
    if type(version) is int and version > FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format_version {version!r}; this clorch reads "
            f"up to {FORMAT_VERSION}: upgrade clorch"
        )
    _check_int(path, "format_version", version, 1)
    for key in _OPTIONAL_TEXT:
        if key in body and not isinstance(body[key], str):
            raise _malformed(path, key, body[key], "a str")
    _check_int(path, "world_size", body["world_size"], 1)
    if not isinstance(body["state"], dict):
        raise _malformed(path, "state", body["state"], "a dict (the training state)")
    check_archive(path, body["archive"], version)
    contents = body["contents"]
    if not isinstance(contents, dict) or any(not isinstance(contents.get(k), bool) for k in _COMPONENTS):
        raise _malformed(path, "contents", contents, f"a dict of {list(_COMPONENTS)} to true/false")
    _check_list(path, "samplers", body["samplers"], body["world_size"])
    for rank, state in enumerate(body["samplers"]):
        if state is not None and not isinstance(state, dict):
            raise _malformed(path, f"samplers[{rank}]", state, "null or a dict (a sampler's state_dict)")
    _check_list(path, "rng", body["rng"], body["world_size"])
    for rank, state in enumerate(body["rng"]):
        problem = rng_state_problem(state)
        if problem is not None:
            key, what = problem
            field = f"rng[{rank}]" + (f".{key}" if key else "")
            raise CheckpointError(f"checkpoint metadata {path} is corrupt: field {field!r} {what}")


def archive_path(metadata_path: Path, body: dict[str, Any]) -> Path:
    """Where the archive named by the metadata at `metadata_path` lives (beside it)."""
    return Path(metadata_path).parent / body["archive"]["file"]
