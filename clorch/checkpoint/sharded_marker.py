"""clorch.json, a sharded checkpoint's own file: JSON, self-checksummed, written last.

Layout (one JSON object):

    format                     2 (format 1 recorded no digests of DCP's files: refused)
    clorch_version, torch_version, world_size
    state                      the training state passed to save_sharded
    has_optimizer              whether DCP's files hold optimizer state
    signature                  parameter name -> [global shape, dtype]
    sampler                    the sampler's global position (null where none)
    rng                        every rank's RNG states (see clorch.checkpoint.rng)
    rank_buffers               the buffers saved once per rank (clorch.checkpoint.rank_buffers)
    files                      every file DCP wrote -> its size and block digests
                               (clorch.checkpoint.sharded_files)
    checksum                   sha256 of the canonical JSON of everything else

It is parsed with `json` only, and every field is checked before anything uses it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from clorch.checkpoint.atomic import open_regular
from clorch.checkpoint.errors import CheckpointError
from clorch.checkpoint.rng import rng_state_problem
from clorch.checkpoint.sharded_files import DCP_METADATA, check_files_field

MARKER = "clorch.json"
"""clorch's file in a sharded checkpoint, written last: a directory without it is incomplete."""
FORMAT = 2
_MAX_BYTES = 64 << 20  # a marker is tens of KiB; refuse to slurp anything large


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True).encode()


def encode_marker(body: dict[str, Any]) -> bytes:
    """clorch.json's bytes: `body` plus its checksum."""
    return json.dumps(dict(body, checksum=hashlib.sha256(_canonical(body)).hexdigest())).encode()


def _parse(path: Path) -> dict[str, Any]:
    marker = path / MARKER
    fd = open_regular(marker, "sharded checkpoint marker")
    with open(fd, "rb") as handle:
        raw = handle.read(_MAX_BYTES + 1)
    try:
        full = json.loads(raw.decode("utf-8")) if len(raw) <= _MAX_BYTES else None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"sharded checkpoint {path}: {marker} is corrupt (not valid JSON: {exc})") from None
    if not isinstance(full, dict) or full.get("format") not in (1, FORMAT):
        raise CheckpointError(f"sharded checkpoint {path}: {marker} is not a clorch sharded checkpoint's")
    if full["format"] == 1:
        raise CheckpointError(
            f"sharded checkpoint {path} records no digests of DCP's files ({marker} is of format 1, written "
            f"by an older clorch): clorch loads no checkpoint unverified; resume from a checkpoint this "
            "clorch wrote, or load it with torch.distributed.checkpoint yourself if you trust its files"
        )
    body = {key: value for key, value in full.items() if key != "checksum"}
    if full.get("checksum") != hashlib.sha256(_canonical(body)).hexdigest():
        raise CheckpointError(f"sharded checkpoint {path}: {marker} is corrupt (its checksum does not match)")
    return body


def _malformed(path: Path, field: str, value: Any, allowed: str) -> CheckpointError:
    return CheckpointError(
        f"sharded checkpoint {path}: {MARKER} is corrupt: field {field!r} is {str(value)[:80]!r}, expected {allowed}"
    )


def _is_signature(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(entry, list)
        and len(entry) == 2
        and isinstance(entry[0], list)
        and all(type(n) is int and n >= 0 for n in entry[0])
        and isinstance(entry[1], str)
        for entry in value.values()
    )


def _validate(path: Path, body: dict[str, Any]) -> None:
    world = body.get("world_size")
    if type(world) is not int or world < 1:
        raise _malformed(path, "world_size", world, "an int >= 1")
    rules = {
        "state": (lambda v: isinstance(v, dict), "a dict (the training state)"),
        "has_optimizer": (lambda v: isinstance(v, bool), "true or false"),
        "signature": (_is_signature, "a dict of parameter name -> [shape, dtype]"),
        "sampler": (lambda v: v is None or isinstance(v, dict), "null or a dict (the sampler's position)"),
        "rng": (lambda v: isinstance(v, list) and len(v) == world, f"a list of {world} entries (one per rank)"),
        "rank_buffers": (
            lambda v: isinstance(v, list) and all(isinstance(n, str) and n in body["signature"] for n in v),
            "a list of the model's buffer names (those saved once per rank)",
        ),
    }
    for field, (fits, allowed) in rules.items():
        if not fits(body.get(field)):
            raise _malformed(path, field, body.get(field), allowed)
    for rank, state in enumerate(body["rng"]):
        problem = rng_state_problem(state)
        if problem is not None:
            key, what = problem
            raise CheckpointError(
                f"sharded checkpoint {path}: {MARKER} is corrupt: field 'rng[{rank}]{'.' + key if key else ''}' {what}"
            )
    check_files_field(path, body.get("files"))


def read_marker(path: Path) -> dict[str, Any]:
    """clorch.json of a committed sharded checkpoint, every field checked (DCP's files not yet verified).

    Raises:
        FileNotFoundError: nothing at `path`.
        CheckpointError: not a directory, no marker or no DCP .metadata (an incomplete or foreign
            directory), a marker that is corrupt, of format 1 (no digests), or not clorch's.
    """
    if not path.exists():
        raise FileNotFoundError(f"no sharded checkpoint at {path}")
    if not path.is_dir():
        raise CheckpointError(f"sharded checkpoint {path} is not a directory")
    if not (path / MARKER).is_file() or not (path / DCP_METADATA).is_file():
        raise CheckpointError(
            f"sharded checkpoint {path} is incomplete: it has no {MARKER} or no DCP "
            f"{DCP_METADATA} (a save that did not finish, or not a clorch checkpoint)"
        )
    try:
        body = _parse(path)
    except OSError as exc:
        raise CheckpointError(f"sharded checkpoint {path}: {MARKER} is unreadable ({exc})") from exc
    _validate(path, body)
    return body
