"""Saving and loading are safe against planted symlinks, foreign files, full disks, FIFOs and malformed metadata."""

from __future__ import annotations

import errno
import json
import os
import re
import threading
from pathlib import Path

import pytest
import torch

import clorch._files as files
from clorch._files import create_exclusive, write_json_atomic
from clorch.checkpoint import CheckpointError, load_checkpoint, save_checkpoint, verify_checkpoint
from clorch.checkpoint import atomic, metadata
from clorch.data import DistributedSampler

pytestmark = pytest.mark.timeout(60)
PACKAGE = Path(__file__).resolve().parents[2] / "clorch" / "checkpoint"


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 8))


def _same(model: torch.nn.Module, seed: int) -> bool:
    return all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), _model(seed).state_dict().values()))


def _loads_as(path: Path, seed: int) -> bool:
    target = _model(seed + 100)
    return load_checkpoint(path, model=target) == {"seed": seed} and _same(target, seed)


def _listing(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file() and not p.is_symlink()}


def _first_token_planted(monkeypatch) -> None:
    """Every other name `create_exclusive` tries is the predictable "planted"; the rest are random."""
    real, calls = files.unique_token, []

    def token() -> str:
        calls.append(None)
        return "planted" if len(calls) % 2 else real()

    monkeypatch.setattr(files, "unique_token", token)


# 1. Temporaries are created exclusively: a planted symlink is never followed.


def test_write_json_atomic_never_writes_through_a_planted_symlink(tmp_path, monkeypatch):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    target = tmp_path / "record.json"
    # The name the old writer used (pid and thread id: predictable), and the one it will try first now.
    old_name = tmp_path / f".record.json.{os.getpid()}.{threading.get_ident()}.tmp"
    new_name = tmp_path / ".record.json.planted.tmp"
    for link in (old_name, new_name):
        link.symlink_to(victim)
    _first_token_planted(monkeypatch)
    write_json_atomic(target, {"step": 7})
    assert victim.read_text() == "precious"
    assert not target.is_symlink() and json.loads(target.read_text()) == {"step": 7}
    assert old_name.is_symlink() and new_name.is_symlink()  # left alone, not replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".record.json.planted.tmp", old_name.name, "record.json", "victim.txt"]
    )


def test_create_exclusive_gives_up_rather_than_open_an_existing_name(tmp_path, monkeypatch):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "x.same.tmp").symlink_to(victim)
    monkeypatch.setattr(files, "unique_token", lambda: "same")
    with pytest.raises(
        FileExistsError, match=f"could not create a new file x\\.\\*\\.tmp in {tmp_path}: 16 random names"
    ):
        create_exclusive(tmp_path, "x.", ".tmp")
    assert victim.read_text() == "precious"
    monkeypatch.undo()
    fd, path = create_exclusive(tmp_path, "x.", ".tmp", 0o600)
    os.close(fd)
    assert re.fullmatch(r"x\.\d+-[0-9a-f]{12}\.tmp", path.name) and path.stat().st_mode & 0o777 == 0o600


def test_checkpoint_files_never_write_through_planted_symlinks(tmp_path, monkeypatch):
    victims = {name: tmp_path / "elsewhere" / name for name in ("archive", "metadata")}
    for name, victim in victims.items():
        victim.parent.mkdir(exist_ok=True)
        victim.write_bytes(os.urandom(100))
    before = {name: victim.read_bytes() for name, victim in victims.items()}
    path = tmp_path / "c.ckpt"
    (tmp_path / "c.ckpt.planted.tensors").symlink_to(victims["archive"])
    (tmp_path / ".c.ckpt.planted.tmp").symlink_to(victims["metadata"])
    _first_token_planted(monkeypatch)
    save_checkpoint(path, model=_model(1), state={"seed": 1})
    assert {name: victim.read_bytes() for name, victim in victims.items()} == before
    assert _loads_as(path, 1)
    archive_name = json.loads(path.read_text())["archive"]["file"]
    assert archive_name != "c.ckpt.planted.tensors" and not (tmp_path / archive_name).is_symlink()


# 2. save_checkpoint never replaces what is not a clorch checkpoint.


@pytest.mark.parametrize("kind", ["torch.save file", "other JSON", "text", "random bytes", "directory", "fifo"])
def test_save_refuses_to_overwrite_a_file_that_is_not_a_checkpoint(tmp_path, kind):
    path = tmp_path / "model.pt"
    if kind == "torch.save file":
        torch.save({"w": torch.randn(3)}, path)
    elif kind == "other JSON":
        path.write_text(json.dumps({"format": "someone-else", "checksum": "0" * 64}))
    elif kind == "text":
        path.write_text("my notes\n")
    elif kind == "random bytes":
        path.write_bytes(os.urandom(4096))
    elif kind == "directory":
        path.mkdir()
    else:
        os.mkfifo(path)
    before = _listing(tmp_path)
    entries = sorted(os.listdir(tmp_path))
    with pytest.raises(
        CheckpointError,
        match=f"save_checkpoint would overwrite {re.escape(str(path))}, which "
        ".*not a clorch checkpoint.*nothing was written",
    ):
        save_checkpoint(path, model=_model(1), state={"seed": 1})
    assert sorted(os.listdir(tmp_path)) == entries and _listing(tmp_path) == before


def test_an_existing_checkpoint_is_still_replaced(tmp_path):
    path = tmp_path / "c.ckpt"
    save_checkpoint(path, model=_model(1), state={"seed": 1})
    save_checkpoint(path, model=_model(2), state={"seed": 2})
    assert _loads_as(path, 2) and len(list(tmp_path.iterdir())) == 2
    # A damaged checkpoint (still declaring the format) is ours to replace, not a foreign file.
    path.write_text(path.read_text().replace('"seed": 2', '"seed": 9'))
    save_checkpoint(path, model=_model(3), state={"seed": 3})
    assert _loads_as(path, 3) and len(list(tmp_path.iterdir())) == 2


# 3. A full disk: a clear error, no partial files, the previous checkpoint intact.


def _fill_disk(monkeypatch, where: str, after: int) -> None:
    """Make checkpoint writes to the archive or the metadata fail with ENOSPC after `after` bytes."""
    real, written = files.write_all, {"bytes": 0}

    def write_all(fd: int, data) -> None:
        name = os.readlink(f"/proc/self/fd/{fd}")
        if not name.endswith(".tensors" if where == "archive" else ".tmp"):
            return real(fd, data)
        view = memoryview(data).cast("B")
        room = max(0, after - written["bytes"])
        real(fd, view[:room])  # what fits lands on disk: the file is partial
        written["bytes"] += min(room, view.nbytes)
        if view.nbytes > room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files, "write_all", write_all)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd to tell the files apart")
@pytest.mark.parametrize("where", ["archive", "metadata"])
def test_a_full_disk_names_the_space_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch, where):
    path = tmp_path / "c.ckpt"
    save_checkpoint(path, model=_model(1), state={"seed": 1})
    before = _listing(tmp_path)
    archive_bytes = json.loads(path.read_text())["archive"]["bytes"]
    _fill_disk(monkeypatch, where, archive_bytes // 2 if where == "archive" else 100)
    model = _model(2)
    with pytest.raises(
        CheckpointError,
        match=rf"not enough disk space to save checkpoint {re.escape(str(path))}: "
        rf"it needs about (\d+) bytes and (\d+) bytes are free",
    ) as info:
        save_checkpoint(path, model=model, state={"seed": 2})
    needed = int(re.search(r"needs about (\d+) bytes", str(info.value)).group(1))
    assert needed == sum(t.nelement() * t.element_size() for t in model.state_dict().values())
    assert "partial files were removed" in str(info.value)
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.ENOSPC
    assert _listing(tmp_path) == before  # no partial archive or temporary, the old files untouched
    monkeypatch.undo()
    assert _loads_as(path, 1)
    save_checkpoint(path, model=_model(3), state={"seed": 3})  # space again: saving works as before
    assert _loads_as(path, 3)


def test_other_write_errors_are_not_reported_as_a_full_disk(tmp_path, monkeypatch):
    path = tmp_path / "c.ckpt"

    def write_all(fd, data):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(files, "write_all", write_all)
    with pytest.raises(OSError) as info:
        save_checkpoint(path, model=_model(1))
    assert info.value.errno == errno.EIO and not isinstance(info.value, CheckpointError)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("failing_sync", [1, 2])
def test_a_failed_commit_keeps_whichever_checkpoint_the_path_names(tmp_path, monkeypatch, failing_sync):
    """Sync 1 fails before the rename (the old checkpoint stays), sync 2 after it (the new one is in place)."""
    path = tmp_path / "c.ckpt"
    save_checkpoint(path, model=_model(1), state={"seed": 1})
    before = _listing(tmp_path)
    real, calls = atomic.fsync_dir, []

    def fsync_dir(directory):
        calls.append(directory)
        if len(calls) == failing_sync:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(directory)

    monkeypatch.setattr(atomic, "fsync_dir", fsync_dir)
    with pytest.raises(OSError, match="Input/output error"):
        save_checkpoint(path, model=_model(2), state={"seed": 2})
    monkeypatch.undo()
    if failing_sync == 1:
        assert _listing(tmp_path) == before and _loads_as(path, 1)
    else:
        assert _loads_as(path, 2)  # committed: its archive was not removed


# 4. A path that is not a regular file is refused at once, never read (a FIFO would block forever).


@pytest.mark.timeout(20)
def test_a_fifo_or_directory_is_refused_without_hanging(tmp_path):
    fifo = tmp_path / "pipe.ckpt"
    os.mkfifo(fifo)
    pattern = f"checkpoint path {re.escape(str(fifo))} is a FIFO \\(named pipe\\), expected a regular file"
    with pytest.raises(CheckpointError, match=pattern):
        verify_checkpoint(fifo)
    with pytest.raises(CheckpointError, match=pattern):
        load_checkpoint(fifo, model=_model(1))
    with pytest.raises(CheckpointError, match=f"checkpoint path {re.escape(str(tmp_path))} is a directory"):
        verify_checkpoint(tmp_path)


@pytest.mark.timeout(20)
def test_an_archive_replaced_by_a_fifo_is_refused_without_hanging(tmp_path):
    path = tmp_path / "c.ckpt"
    save_checkpoint(path, model=_model(1), state={"seed": 1})
    archive_file = tmp_path / json.loads(path.read_text())["archive"]["file"]
    archive_file.unlink()
    os.mkfifo(archive_file)
    with pytest.raises(CheckpointError, match=f"checkpoint archive {re.escape(str(archive_file))} is a FIFO"):
        verify_checkpoint(path)


# 5. Malformed fields under a valid checksum: CheckpointError naming the field.


def _set(*keys_and_value):
    *keys, value = keys_and_value

    def mutate(body: dict) -> None:
        node = body
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value

    return mutate


MALFORMED = [
    ("archive.block_bytes", _set("archive", "block_bytes", 0)),
    ("archive.block_bytes", _set("archive", "block_bytes", "4194304")),
    ("archive.block_bytes", _set("archive", "block_bytes", None)),
    ("archive.bytes", _set("archive", "bytes", -1)),
    ("archive.bytes", _set("archive", "bytes", 1.5)),
    ("archive.block_digests", _set("archive", "block_digests", "abc")),
    ("archive.block_digests", _set("archive", "block_digests", ["zz"])),
    ("archive.block_digests", _set("archive", "block_digests", [])),
    ("archive.block_digests", _set("archive", "block_digests", ["0" * 64])),  # a sha256's length
    ("archive.digest", _set("archive", "digest", 5)),
    ("archive.hash", _set("archive", "hash", "md5")),
    ("archive.file", _set("archive", "file", "../elsewhere.tensors")),
    ("archive", _set("archive", None)),
    ("world_size", _set("world_size", "1")),
    ("world_size", _set("world_size", 0)),
    ("world_size", _set("world_size", True)),
    ("world_size", _set("world_size", None)),
    ("samplers", _set("world_size", 2)),  # samplers and rng hold one entry, not two
    ("format_version", _set("format_version", "1")),
    ("format_version", _set("format_version", 0)),
    ("state", _set("state", [1, 2])),
    ("contents", _set("contents", {"model": "yes", "optimizer": False, "scaler": False})),
    ("contents", _set("contents", None)),
    ("samplers", _set("samplers", {"0": None})),
    ("samplers", _set("samplers", [])),
    ("rng", _set("rng", None)),
    ("rng[0]", _set("rng", [None])),
    ("rng[0].torch", _set("rng", 0, "torch", "not base64!")),
    ("rng[0].torch", _set("rng", 0, "torch", "AAAA")),
    ("rng[0].python", _set("rng", 0, "python", "x")),
    ("rng[0].python", _set("rng", 0, "python", [3, [-1] * 625, None])),
    ("rng[0].python", _set("rng", 0, "python", [3, list(range(625)), "gauss"])),
    ("rng[0].numpy", _set("rng", 0, "numpy", ["MT19937", ["a"] * 624, 0, 0, 0.0])),
    ("rng[0].numpy", _set("rng", 0, "numpy", {"keys": []})),
    ("rng[0].cuda", _set("rng", 0, "cuda", {"device": -1, "state": "AAAA"})),
    ("rng[0].cuda", _set("rng", 0, "cuda", {"device": 0, "state": None})),
    ("created", _set("created", 5)),
]


@pytest.mark.parametrize("field,mutate", MALFORMED, ids=[f"{i}-{f}" for i, (f, _) in enumerate(MALFORMED)])
def test_malformed_metadata_with_a_valid_checksum_names_the_field(tmp_path, field, mutate):
    path = tmp_path / "c.ckpt"
    save_checkpoint(
        path, model=_model(1), sampler=DistributedSampler(40, num_replicas=1, rank=0, seed=1), state={"seed": 1}
    )
    body = json.loads(path.read_text())
    del body["checksum"]
    mutate(body)
    path.write_bytes(metadata.encode(body))  # re-signed: only the field check can catch it
    pattern = f"checkpoint metadata {re.escape(str(path))} is corrupt: field {re.escape(repr(field))} "
    with pytest.raises(CheckpointError, match=pattern):
        verify_checkpoint(path)
    victim = _model(2)
    with pytest.raises(CheckpointError, match=pattern):
        load_checkpoint(path, model=victim, sampler=DistributedSampler(40, num_replicas=1, rank=0, seed=1))
    assert _same(victim, 2)


def test_a_newer_format_version_asks_for_an_upgrade(tmp_path):
    path = tmp_path / "c.ckpt"
    save_checkpoint(path, model=_model(1))
    body = json.loads(path.read_text())
    del body["checksum"]
    body["format_version"] = metadata.FORMAT_VERSION + 1
    path.write_bytes(metadata.encode(body))
    with pytest.raises(CheckpointError, match="has format_version 3; this clorch reads up to 2: upgrade clorch"):
        verify_checkpoint(path)


# 6. The product carries no test hook: the crash tests inject their pauses themselves.


def test_the_checkpoint_package_reads_no_environment_variables():
    for source in PACKAGE.glob("*.py"):
        text = source.read_text()
        assert "os.environ" not in text and "getenv" not in text and "TEST_PAUSE" not in text, source


def test_saving_a_path_leaves_the_files_of_a_checkpoint_whose_name_extends_it(tmp_path):
    """`ckpt` and `ckpt.best` live side by side: saving (or replacing) one never touches the other's archive."""
    best, plain = tmp_path / "ckpt.best", tmp_path / "ckpt"
    save_checkpoint(best, model=_model(1))
    save_checkpoint(plain, model=_model(2))
    save_checkpoint(plain, model=_model(3))  # supersedes ckpt's own first archive only
    victim = _model(4)
    load_checkpoint(best, model=victim)
    assert _same(victim, 1)
    assert len(list(tmp_path.glob("ckpt.best.*.tensors"))) == 1
    assert len([p for p in tmp_path.glob("ckpt.*.tensors") if not p.name.startswith("ckpt.best.")]) == 1
