"""Placing a task's split on the training device once (`clorch.data.placement`)."""

from __future__ import annotations

import warnings

import pytest
import torch

from clorch.data.placement import place_task
from clorch.data.tasks import build_task
from clorch.train.loop import to_device

pytestmark = pytest.mark.timeout(60)


def _tasks(text_file):
    return [
        build_task("synthetic", split="train", seed=0, sample_count=64, in_features=8, out_features=3),
        build_task("arithmetic", split="eval", seed=0, sample_count=64, digits=2),
        build_task("text", split="train", seed=0, path=text_file, seq_len=32),
    ]


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    return str(path)


def test_nothing_moves_on_the_cpu_or_beyond_the_limit(text_file):
    for task in _tasks(text_file):
        before = task.batch([0, 1])
        assert place_task(task, torch.device("cpu")) is False
        assert place_task(task, torch.device("meta"), limit_bytes=1) is False  # too large: stays
        for key, value in task.batch([0, 1]).items():
            assert value.device.type == "cpu" and torch.equal(value, before[key])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_placed_tasks_give_the_same_batches_on_the_gpu_without_host_syncs(text_file):
    device = torch.device("cuda", 0)
    for task in _tasks(text_file):
        want = task.batch([3, 0, 5])
        assert place_task(task, device) is True
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = to_device(task.batch([3, 0, 5]), device, pin=True)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert not [w for w in caught if "synchronizing" in str(w.message).lower()]
        for key, value in want.items():
            assert got[key].device == device and torch.equal(got[key].cpu(), value), key
        with pytest.raises(IndexError, match=f"index {len(task)} is out of range for a split of {len(task)}"):
            task.batch([0, len(task)])


def test_indices_for_a_device_split_are_checked_on_the_host_first():
    from clorch.data.base import as_index

    meta = torch.device("meta")  # any non-CPU device: the check runs before the copy
    assert as_index([0, 3, -4], meta, size=4).device == meta
    for bad, shown in (([0, 4], 4), ([-5, 1], -5)):
        with pytest.raises(IndexError, match=f"index {shown} is out of range for a split of 4 samples"):
            as_index(bad, meta, size=4)
