"""clorch's DistributedSampler as torch code sees it: isinstance, torch's attributes, a settable epoch."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset
from torch.utils.data.distributed import DistributedSampler as TorchSampler

from clorch.data import DistributedSampler

pytestmark = pytest.mark.timeout(60)


def _torch_trainer_epoch(sampler, epoch):
    """What torch trainers do: set the epoch only on a torch DistributedSampler."""
    if isinstance(sampler, TorchSampler):
        sampler.set_epoch(epoch)
    return list(sampler)


def test_passes_torchs_isinstance_check_so_trainers_reshuffle():
    sampler = DistributedSampler(40, num_replicas=2, rank=1, seed=3)
    assert isinstance(sampler, TorchSampler)
    first, second = _torch_trainer_epoch(sampler, 0), _torch_trainer_epoch(sampler, 1)
    assert sampler.epoch == 1 and first != second
    torchs = TorchSampler(range(40), num_replicas=2, rank=1, seed=3)
    torchs.set_epoch(1)
    assert second == list(torchs)


@pytest.mark.parametrize("drop_last", [False, True])
def test_has_torchs_attributes_with_torchs_values(drop_last):
    dataset = TensorDataset(torch.randn(11, 2))
    ours = DistributedSampler(dataset, num_replicas=3, rank=2, shuffle=False, seed=5, drop_last=drop_last)
    theirs = TorchSampler(dataset, num_replicas=3, rank=2, shuffle=False, seed=5, drop_last=drop_last)
    for name in ("num_replicas", "rank", "epoch", "shuffle", "seed", "drop_last", "num_samples", "total_size"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.dataset is dataset and list(ours) == list(theirs)


def test_setting_epoch_acts_like_set_epoch():
    sampler = DistributedSampler(30, num_replicas=2, rank=0)
    reference = DistributedSampler(30, num_replicas=2, rank=0)
    sampler.epoch = 3
    reference.set_epoch(3)
    assert sampler.epoch == 3 and list(sampler) == list(reference)
    resumed = DistributedSampler(30, num_replicas=2, rank=0)
    resumed.epoch = 3
    resumed.advance(4)
    resumed.epoch = 3  # the current epoch keeps its position, as set_epoch(3) does
    assert resumed.remaining() == 11
    resumed.epoch = 4  # a new epoch starts at 0
    assert resumed.remaining() == 15
    with pytest.raises(ValueError, match="epoch"):
        sampler.epoch = -1


def test_a_sample_count_is_its_dataset():
    assert DistributedSampler(7, num_replicas=1, rank=0).dataset == 7


def test_refuses_to_run_alone_when_the_environment_says_world_size_2(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match=r"DistributedSampler: .*WORLD_SIZE=2.*init_process_group"):
        DistributedSampler(10)
    with pytest.raises(RuntimeError, match="WORLD_SIZE=2"):
        DistributedSampler(10, num_replicas=2)  # rank still comes from the (missing) group
    assert len(DistributedSampler(10, num_replicas=2, rank=1)) == 5  # both given: no group needed
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert DistributedSampler(10).num_replicas == 1
