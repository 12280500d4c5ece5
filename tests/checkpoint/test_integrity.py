"""Loading runs no code and never loads a damaged or mismatched checkpoint, even partly."""

from __future__ import annotations

import json
import os

import pytest
import torch

from clorch.checkpoint import CheckpointError, load_checkpoint, save_checkpoint, verify_checkpoint
from clorch.checkpoint import archive, metadata
from clorch.data import DistributedSampler

pytestmark = pytest.mark.timeout(60)


class _Evil:
    """Unpickling this would create `marker`: the classic code-on-load payload."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))


def _saved(tmp_path, **extra):
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 5)).sum().backward()
    optimizer.step()
    path = tmp_path / "c.ckpt"
    save_checkpoint(path, model=model, optimizer=optimizer, state={"step": 3}, **extra)
    body = json.loads(path.read_text())
    return path, tmp_path / body["archive"]["file"], model, optimizer


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def _unchanged(model, before) -> bool:
    return all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def _rewrite_metadata(path, archive_file):
    """Re-sign the metadata for the current archive bytes, as an attacker controlling both could."""
    body = metadata.read(path)
    fd = os.open(archive_file, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        blocks = archive.hash_blocks(fd, size, body["archive"]["block_bytes"])
    finally:
        os.close(fd)
    body["archive"].update(bytes=size, block_digests=blocks, digest=archive.root_digest(blocks))
    path.write_bytes(metadata.encode(body))


@pytest.mark.parametrize("resign", [True, False])
def test_a_malicious_pickle_is_refused_and_runs_nothing(tmp_path, resign):
    path, archive_file, _, _ = _saved(tmp_path)
    marker = tmp_path / "pwned"
    archive_file.unlink()
    torch.save({"model": {"w": _Evil(str(marker))}}, archive_file)
    if resign:  # checksums match: torch.load(weights_only=True) itself must refuse it
        _rewrite_metadata(path, archive_file)
    victim = _model(1)
    before = _params(victim)
    expected = "refusing to load .*not a plain tensor archive" if resign else "truncated or was changed"
    with pytest.raises(CheckpointError, match=expected):
        load_checkpoint(path, model=victim)
    with pytest.raises(CheckpointError, match=expected):
        verify_checkpoint(path)
    assert not marker.exists()
    assert _unchanged(victim, before)


def test_a_truncated_archive_is_detected_and_nothing_is_loaded(tmp_path):
    path, archive_file, _, _ = _saved(tmp_path)
    size = archive_file.stat().st_size
    os.truncate(archive_file, size // 2)
    victim = _model(1)
    before = _params(victim)
    with pytest.raises(
        CheckpointError,
        match=f"{archive_file} is truncated or was changed: it has {size // 2} bytes, its metadata .* records {size}",
    ):
        load_checkpoint(path, model=victim)
    assert _unchanged(victim, before)


def test_one_flipped_byte_in_the_archive_is_detected(tmp_path):
    path, archive_file, _, _ = _saved(tmp_path)
    data = bytearray(archive_file.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside the tensor data, where torch.load would not notice
    archive_file.write_bytes(bytes(data))
    victim = _model(1)
    victim_opt = torch.optim.AdamW(victim.parameters(), lr=0.1)
    before = _params(victim)
    with pytest.raises(CheckpointError, match=f"{archive_file} is corrupt: xxh3_128 of bytes \\[0, "):
        load_checkpoint(path, model=victim, optimizer=victim_opt)
    assert _unchanged(victim, before) and not victim_opt.state


def _as_format_version_1(path, archive_file):
    """Rewrite the metadata as clorch wrote it before XXH3: sha256 blocks under format_version 1."""
    body = metadata.read(path)
    fd = os.open(archive_file, os.O_RDONLY)
    try:
        blocks = archive.hash_blocks(fd, os.fstat(fd).st_size, body["archive"]["block_bytes"], "sha256")
    finally:
        os.close(fd)
    info = body["archive"]
    for key in ("hash", "block_digests", "digest"):
        del info[key]
    info.update(block_sha256=blocks, sha256=archive.root_digest(blocks, "sha256"))
    body["format_version"] = 1
    path.write_bytes(metadata.encode(body))


def test_format_version_1_checkpoints_verify_with_sha256(tmp_path):
    path, archive_file, model, _ = _saved(tmp_path)
    _as_format_version_1(path, archive_file)
    victim = _model(1)
    load_checkpoint(path, model=victim, optimizer=torch.optim.AdamW(victim.parameters(), lr=0.1))
    assert _unchanged(victim, _params(model))
    data = bytearray(archive_file.read_bytes())
    data[len(data) // 2] ^= 0x01
    archive_file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"{archive_file} is corrupt: sha256 of bytes \\[0, "):
        verify_checkpoint(path)


def test_a_flipped_byte_in_the_metadata_is_detected(tmp_path):
    path, _, model, _ = _saved(tmp_path)
    text = path.read_text().replace('"step": 3', '"step": 4')
    path.write_text(text)
    with pytest.raises(CheckpointError, match=f"{path} is corrupt: its checksum does not match"):
        load_checkpoint(path, model=model)
    path.write_text(text[:-20])
    with pytest.raises(CheckpointError, match="is corrupt \\(not valid JSON"):
        verify_checkpoint(path)


def test_missing_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no checkpoint at {tmp_path / 'none.ckpt'}"):
        load_checkpoint(tmp_path / "none.ckpt", model=_model())
    path, archive_file, model, _ = _saved(tmp_path)
    archive_file.unlink()
    with pytest.raises(CheckpointError, match=f"checkpoint archive {archive_file}, named by {path}, is missing"):
        load_checkpoint(path, model=model)
    torch.save({"x": torch.randn(2)}, tmp_path / "plain.pt")
    with pytest.raises(CheckpointError, match="is not a clorch checkpoint metadata file"):
        verify_checkpoint(tmp_path / "plain.pt")


def test_mismatched_model_and_optimizer_keys_are_all_listed(tmp_path):
    path, _, _, _ = _saved(tmp_path)
    other = torch.nn.Sequential(torch.nn.Linear(5, 9), torch.nn.ReLU(), torch.nn.Linear(9, 3), torch.nn.Linear(3, 3))
    before = _params(other)
    with pytest.raises(ValueError) as info:
        load_checkpoint(path, model=other)
    message = str(info.value)
    assert "missing keys (in the model, not in the checkpoint): 3.weight, 3.bias" in message
    assert "0.weight: checkpoint (7, 5), model (9, 5)" in message
    assert "2.weight: checkpoint (3, 7), model (3, 9)" in message
    assert _unchanged(other, before)
    smaller = torch.nn.Sequential(torch.nn.Linear(5, 7))
    with pytest.raises(ValueError, match="unexpected keys \\(in the checkpoint, not in the model\\): 2.weight, 2.bias"):
        load_checkpoint(path, model=smaller)
    model = _model(2)
    partial = torch.optim.AdamW(list(model.parameters())[:2], lr=0.1)
    with pytest.raises(
        ValueError, match="optimizer parameter groups differ: checkpoint has sizes \\[4\\], the optimizer \\[2\\]"
    ):
        load_checkpoint(path, model=model, optimizer=partial)


def test_sampler_state_from_another_sampler_is_refused_before_anything_loads(tmp_path):
    path, _, _, _ = _saved(tmp_path, sampler=DistributedSampler(40, num_replicas=1, rank=0, seed=1))
    victim = _model(1)
    before = _params(victim)
    with pytest.raises(ValueError, match="dataset_size: saved 40, this sampler 50; seed: saved 1, this sampler 2"):
        load_checkpoint(path, model=victim, sampler=DistributedSampler(50, num_replicas=1, rank=0, seed=2))
    assert _unchanged(victim, before)


def test_bad_arguments_are_named(tmp_path):
    model = _model()
    with pytest.raises(TypeError, match=r"state\['lr'\]\[1\] must be JSON-serializable .* got Tensor"):
        save_checkpoint(tmp_path / "a.ckpt", model=model, state={"lr": [0.1, torch.ones(1)]})
    with pytest.raises(TypeError, match="state keys must be str to be saved as JSON, got 3"):
        save_checkpoint(tmp_path / "a.ckpt", model=model, state={3: "x"})
    with pytest.raises(
        TypeError, match="optimizer must have state_dict\\(\\) and load_state_dict\\(\\) methods, got str"
    ):
        save_checkpoint(tmp_path / "a.ckpt", model=model, optimizer="adam")
    with pytest.raises(TypeError, match="path must be a str or pathlib.Path, got int"):
        load_checkpoint(3, model=model)
    assert list(tmp_path.iterdir()) == []
