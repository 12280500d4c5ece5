"""Naming, when to save, which checkpoint is latest, and pruning."""

from __future__ import annotations

import os

import pytest
import torch

from clorch.checkpoint import (
    CheckpointPolicy,
    latest_checkpoint,
    prune_checkpoints,
    save_checkpoint,
    should_save,
    step_checkpoint_path,
)

pytestmark = pytest.mark.timeout(60)


def _save(directory, step, seed):
    torch.manual_seed(seed)
    path = step_checkpoint_path(directory, step)
    save_checkpoint(path, model=torch.nn.Linear(4, 3), state={"step": step})
    return path


def test_step_paths_sort_by_step(tmp_path):
    assert step_checkpoint_path(tmp_path, 100) == tmp_path / "step_00000100.ckpt"
    assert step_checkpoint_path(str(tmp_path), 123456789).name == "step_123456789.ckpt"
    with pytest.raises(ValueError, match="step must be >= 0, got -1"):
        step_checkpoint_path(tmp_path, -1)
    with pytest.raises(TypeError, match="step must be an int, got '3'"):
        step_checkpoint_path(tmp_path, "3")


def test_should_save_on_steps_and_epoch_ends():
    every3 = [s for s in range(0, 10) if should_save(s, every_n_steps=3, epoch_end=False, at_epoch_end=True)]
    assert every3 == [3, 6, 9]
    assert should_save(4, every_n_steps=None, epoch_end=True, at_epoch_end=True)
    assert not should_save(4, every_n_steps=None, epoch_end=True, at_epoch_end=False)
    assert not should_save(4, every_n_steps=3, epoch_end=False, at_epoch_end=True)
    with pytest.raises(ValueError, match="every_n_steps must be >= 1, got 0"):
        should_save(4, every_n_steps=0, epoch_end=False, at_epoch_end=True)
    policy = CheckpointPolicy(every_n_steps=5, at_epoch_end=False, keep_last=2)
    assert policy.should_save(10, epoch_end=False) and not policy.should_save(11, epoch_end=True)
    with pytest.raises(ValueError, match="keep_last must be >= 1, got 0"):
        CheckpointPolicy(keep_last=0)
    with pytest.raises(TypeError, match="at_epoch_end must be a bool, got 'yes'"):
        CheckpointPolicy(at_epoch_end="yes")


def test_latest_skips_and_reports_a_corrupt_one_and_ignores_leftovers(tmp_path):
    assert latest_checkpoint(tmp_path / "absent") is None and latest_checkpoint(tmp_path) is None
    _save(tmp_path, 10, 0)
    newest = _save(tmp_path, 20, 1)
    (tmp_path / ".step_00000030.ckpt.1-ab.tmp").write_text("{}")  # a crashed save's temporary
    (tmp_path / "step_00000040.ckpt.1-cd.tensors").write_bytes(os.urandom(64))  # and its partial archive
    assert latest_checkpoint(tmp_path) == newest
    archive = next(tmp_path.glob("step_00000020.ckpt.*.tensors"))
    data = bytearray(archive.read_bytes())
    data[-100] ^= 0x40
    archive.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match=f"skipping checkpoint {newest}: checkpoint archive .* is corrupt"):
        assert latest_checkpoint(tmp_path) == step_checkpoint_path(tmp_path, 10)


def test_prune_keeps_the_newest_and_removes_their_archives_and_dead_leftovers(tmp_path):
    paths = [_save(tmp_path, step, step) for step in (1, 2, 3, 4)]
    (tmp_path / ".step_00000002.ckpt.9-ab.tmp").write_text("{}")
    (tmp_path / "step_00000003.ckpt.9-cd.tensors").write_bytes(b"partial")  # orphan of a kept step
    (tmp_path / "step_00000005.ckpt.9-ef.tensors").write_bytes(b"maybe in progress")
    removed = prune_checkpoints(tmp_path, keep_last=2)
    assert removed == [paths[1], paths[0]]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert [n for n in left if n.endswith(".ckpt")] == ["step_00000003.ckpt", "step_00000004.ckpt"]
    assert len([n for n in left if n.endswith(".tensors")]) == 3  # the 2 kept + step 5's (maybe in progress)
    assert "step_00000005.ckpt.9-ef.tensors" in left
    assert latest_checkpoint(tmp_path) == paths[3]
    with pytest.raises(ValueError, match="keep_last must be >= 1, got 0"):
        prune_checkpoints(tmp_path, keep_last=0)
    assert CheckpointPolicy(keep_last=1).prune(tmp_path) == [paths[2]]
