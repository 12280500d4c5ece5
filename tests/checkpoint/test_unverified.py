"""No checkpoint loads unverified: metadata whose archive checksums are null, missing or of the
other format (its own checksum recomputed, as anyone can) is refused with a CheckpointError
naming the file, by every load path."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest
import torch

from clorch.checkpoint import CheckpointError, load_checkpoint, save_checkpoint, verify_checkpoint
from clorch.checkpoint.archive import BLOCK_BYTES, read_archive, root_digest
from clorch.checkpoint.metadata import encode
from clorch.checkpoint.weights import read_weights

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    directory = tmp_path_factory.mktemp("unverified")
    save_checkpoint(directory / "good.ckpt", model=torch.nn.Linear(4, 2), state={"step": 1})
    body = json.loads((directory / "good.ckpt").read_text())
    body.pop("checksum")
    return directory, body


def _as_format_1(body: dict) -> dict:
    """The same checkpoint as format_version 1 wrote it: sha256 blocks, no "hash"."""
    archive = body["archive"]
    data = (Path(archive["path"])).read_bytes()
    blocks = [hashlib.sha256(data[i : i + BLOCK_BYTES]).hexdigest() for i in range(0, len(data), BLOCK_BYTES)]
    old = {k: archive[k] for k in ("file", "bytes", "block_bytes")}
    return {
        **body,
        "format_version": 1,
        "archive": {**old, "block_sha256": blocks, "sha256": root_digest(blocks, "sha256")},
    }


def _crafted(saved, version: int, change) -> Path:
    directory, body = saved
    body = copy.deepcopy(body)
    if version == 1:
        body["archive"]["path"] = str(directory / body["archive"]["file"])
        body = _as_format_1(body)
    change(body["archive"])
    path = directory / f"crafted-{version}.ckpt"
    path.write_bytes(encode(body))  # a valid checksum is easy to recompute
    return path


def _set(key, value):
    return lambda archive: archive.__setitem__(key, value)


def _drop(key):
    return lambda archive: archive.pop(key)


CASES = {
    2: {
        "block_digests null": _set("block_digests", None),
        "block_digests missing": _drop("block_digests"),
        "digest null": _set("digest", None),
        "hash null": _set("hash", None),
        "hash missing": _drop("hash"),
        "a null block_sha256 beside": _set("block_sha256", None),
    },
    1: {
        "block_sha256 null": _set("block_sha256", None),
        "block_sha256 missing": _drop("block_sha256"),
        "sha256 null": _set("sha256", None),
        "a hash beside": lambda a: a.update(hash="xxh3_128", block_digests=None, digest=None),
    },
}


@pytest.mark.parametrize("version", [1, 2])
def test_the_untouched_checkpoint_of_either_format_loads(saved, version):
    path = _crafted(saved, version, lambda archive: None)
    assert verify_checkpoint(path)["state"] == {"step": 1}
    assert set(read_weights(path)) == {"weight", "bias"}


@pytest.mark.parametrize("version,case", [(v, c) for v in CASES for c in CASES[v]])
def test_null_or_missing_block_hashes_are_refused_by_every_load_path(saved, version, case):
    path = _crafted(saved, version, CASES[version][case])
    with pytest.raises(CheckpointError, match=str(path)):
        verify_checkpoint(path)
    with pytest.raises(CheckpointError, match=str(path)):
        load_checkpoint(path, model=torch.nn.Linear(4, 2))
    with pytest.raises(ValueError, match=str(path)) as refused:  # init_from's reader
        read_weights(path)
    assert isinstance(refused.value.__cause__, CheckpointError)


def test_the_archive_reader_itself_refuses_an_entry_without_checksums(saved):
    directory, body = saved
    archive = directory / body["archive"]["file"]
    info = {k: v for k, v in body["archive"].items() if k not in ("block_digests", "digest")}
    with pytest.raises(CheckpointError, match=f"refusing to load checkpoint archive {archive} unverified"):
        read_archive(archive, info, directory / "good.ckpt")


class _Evil:
    """Unpickling this creates `marker`: the classic code-on-load payload."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _evil_torch_file(tmp_path: Path, marker: Path) -> Path:
    path = tmp_path / "weights.pt"
    torch.save({"weight": torch.zeros(2, 4), "bias": _Evil(str(marker))}, path)
    return path


def _evil_clorch_checkpoint(tmp_path: Path, marker: Path) -> Path:
    """A clorch checkpoint whose archive is the payload, its digests and checksum re-signed."""
    from clorch.checkpoint.archive import HASH, hash_blocks

    path = tmp_path / "evil.ckpt"
    save_checkpoint(path, model=torch.nn.Linear(4, 2), state={"step": 1})
    body = json.loads(path.read_text())
    body.pop("checksum")
    archive = tmp_path / body["archive"]["file"]
    archive.unlink()
    torch.save({"model": {"weight": _Evil(str(marker))}}, archive)
    with open(archive, "rb") as handle:
        size = archive.stat().st_size
        blocks = hash_blocks(handle.fileno(), size, body["archive"]["block_bytes"])
    body["archive"].update(bytes=size, hash=HASH, block_digests=blocks, digest=root_digest(blocks))
    path.write_bytes(encode(body))
    return path


def _evil_sharded_checkpoint(tmp_path: Path, marker: Path) -> Path:
    """A sharded checkpoint whose DCP .metadata is the payload, clorch.json re-signed."""
    import pickle

    from clorch.checkpoint.sharded import save_sharded
    from clorch.checkpoint.sharded_files import file_entry
    from clorch.checkpoint.sharded_marker import MARKER, encode_marker

    path = save_sharded(tmp_path / "evil.dcp", model=torch.nn.Linear(4, 2))
    (path / ".metadata").write_bytes(pickle.dumps(_Evil(str(marker))))
    body = json.loads((path / MARKER).read_text())
    body.pop("checksum")
    body["files"] = {p.name: file_entry(p) for p in sorted(path.iterdir()) if p.name != MARKER}
    (path / MARKER).write_bytes(encode_marker(body))
    return path


CRAFTED = {
    "a torch.save file": _evil_torch_file,
    "a clorch checkpoint": _evil_clorch_checkpoint,
    "a sharded checkpoint": _evil_sharded_checkpoint,
}


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")
@pytest.mark.parametrize("kind", CRAFTED)
def test_init_from_a_crafted_file_runs_nothing(tmp_path, kind):
    """model.init_from reads weights with no code run from the file, whatever its kind: refused
    before launch (the plan's check) and by the reader the ranks use."""
    from clorch.config import compose
    from clorch.plan.plan import resolve_errors

    marker = tmp_path / "pwned"
    path = CRAFTED[kind](tmp_path, marker)
    errors = resolve_errors(compose(["+recipe=cpu_smoke", f"model.init_from={path}"]))
    assert any(e.startswith("model.init_from=") and str(path) in e for e in errors), errors
    with pytest.raises(ValueError, match=str(path)):
        read_weights(path)
    assert not marker.exists()
