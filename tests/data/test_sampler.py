"""DistributedSampler: torch-compatible order, disjoint covering shares, exact mid-epoch resume."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler as TorchSampler

from clorch.data import DistributedSampler

pytestmark = pytest.mark.timeout(60)

SIZES = (0, 1, 2, 5, 7, 16, 33, 100)
REPLICAS = (1, 2, 3, 4, 7)


def _shares(size, replicas, seed, epoch, drop_last, shuffle=True):
    samplers = [
        DistributedSampler(size, num_replicas=replicas, rank=r, seed=seed, shuffle=shuffle, drop_last=drop_last)
        for r in range(replicas)
    ]
    for sampler in samplers:
        sampler.set_epoch(epoch)
    return samplers, [s.sample_indices() for s in samplers]


@pytest.mark.parametrize("drop_last", [False, True])
def test_shares_match_torch_and_are_disjoint_covering_and_equal(drop_last):
    for size, replicas, seed, epoch in itertools.product(SIZES, REPLICAS, (0, 11), (0, 3)):
        samplers, shares = _shares(size, replicas, seed, epoch, drop_last)
        case = (size, replicas, seed, epoch, drop_last)
        # Same order as torch's sampler, computed independently by torch itself.
        for rank, share in enumerate(shares):
            reference = (
                TorchSampler(range(size), num_replicas=replicas, rank=rank, seed=seed, drop_last=drop_last)
                if size
                else None
            )
            if reference is not None:
                reference.set_epoch(epoch)
                assert share == list(reference), case
        lengths = {len(share) for share in shares}
        assert lengths == {len(samplers[0])}, case
        flat = [i for share in shares for i in share]
        assert all(0 <= i < size for i in flat), case
        if drop_last:
            assert len(set(flat)) == len(flat) == (size // replicas) * replicas, case
        else:
            assert set(flat) == set(range(size)), case
            assert len(flat) - len(set(flat)) == (-size) % replicas if size else not flat, case


def test_deterministic_and_different_across_epochs():
    for size, replicas, seed in itertools.product((16, 33, 100), (1, 3), (0, 5)):
        _, first = _shares(size, replicas, seed, 1, False)
        _, again = _shares(size, replicas, seed, 1, False)
        _, other_epoch = _shares(size, replicas, seed, 2, False)
        _, other_seed = _shares(size, replicas, seed + 1, 1, False)
        assert first == again
        assert first != other_epoch and first != other_seed
    _, ordered = _shares(10, 2, 0, 4, False, shuffle=False)
    assert ordered == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]


def test_without_set_epoch_every_pass_repeats_the_permutation():
    sampler = DistributedSampler(23, num_replicas=2, rank=1, seed=4)
    full = sampler.sample_indices()
    assert sampler.sample_indices() == full  # a read does not move the position
    assert list(sampler) == list(sampler) == full
    assert sampler.sample_indices() == []  # iteration consumed this epoch


@pytest.mark.parametrize("drop_last", [False, True])
def test_mid_epoch_resume_yields_exactly_the_remaining_indices(drop_last):
    for size, replicas, consumed in ((37, 3, 5), (100, 4, 24), (16, 2, 8), (9, 2, 0)):
        for rank in range(replicas):
            args = dict(num_replicas=replicas, rank=rank, seed=9, drop_last=drop_last)
            sampler = DistributedSampler(size, **args)
            sampler.set_epoch(2)
            full = sampler.sample_indices()
            consumed_here = min(consumed, len(full))
            took = list(itertools.islice(iter(sampler), consumed_here))  # consumption by iteration
            assert took == full[:consumed_here]
            resumed = DistributedSampler(size, **args)
            resumed.load_state_dict(sampler.state_dict())
            resumed.set_epoch(2)  # the usual epoch loop after a resume keeps the position
            assert resumed.sample_indices() == full[consumed_here:]
            assert list(resumed) == full[consumed_here:]
            assert len(resumed) == len(full) and resumed.remaining() == 0
            resumed.set_epoch(3)
            assert resumed.remaining() == len(full)


def test_advance_then_resume_and_restored_exhausted_epoch_is_not_replayed():
    sampler = DistributedSampler(20, num_replicas=2, rank=0, seed=1)
    full = sampler.sample_indices()
    sampler.advance(4)
    assert sampler.sample_indices() == full[4:] and sampler.remaining() == 6
    sampler.advance(6)
    state = sampler.state_dict()
    assert state["consumed"] == 10 and sampler.sample_indices() == []
    restored = DistributedSampler(20, num_replicas=2, rank=0, seed=1)
    restored.load_state_dict(state)
    assert list(restored) == []  # the saved epoch was finished: nothing is replayed
    assert list(restored) == full  # a further pass without set_epoch repeats it, like torch


def test_dataloader_accepts_it_and_iteration_moves_the_position():
    data = torch.randn(30, 3)
    sampler = DistributedSampler(30, num_replicas=3, rank=2, seed=8)
    loader = DataLoader(TensorDataset(data), batch_size=4, sampler=sampler)
    batches = iter(loader)
    first, second = next(batches)[0], next(batches)[0]
    assert sampler.state_dict()["consumed"] == 8  # exactly the two batches handed out
    order = DistributedSampler(30, num_replicas=3, rank=2, seed=8).sample_indices()
    assert torch.equal(torch.cat([first, second]), data[order[:8]])


def test_bad_arguments_name_the_allowed_interval():
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\) \(num_replicas=2\), got 2"):
        DistributedSampler(10, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 3\) \(num_replicas=3\), got -1"):
        DistributedSampler(10, num_replicas=3, rank=-1)
    with pytest.raises(ValueError, match="dataset must be >= 0, got -1"):
        DistributedSampler(-1, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="num_replicas must be >= 1, got 0"):
        DistributedSampler(10, num_replicas=0, rank=0)
    with pytest.raises(
        TypeError, match=r"dataset must be a dataset with len\(\) or a sample count \(int >= 0\), got float"
    ):
        DistributedSampler(3.5)
    with pytest.raises(TypeError, match="shuffle must be a bool, got 'yes'"):
        DistributedSampler(4, shuffle="yes")
    sampler = DistributedSampler(10, num_replicas=2, rank=0)
    with pytest.raises(ValueError, match=r"n must be in \[0, 5\] \(indices left in epoch 0\), got 6"):
        sampler.advance(6)
    with pytest.raises(ValueError, match="epoch must be >= 0, got -2"):
        sampler.set_epoch(-2)


def test_loading_another_samplers_state_says_what_differs():
    state = DistributedSampler(100, num_replicas=2, rank=1, seed=3).state_dict()
    other = DistributedSampler(120, num_replicas=4, rank=1, seed=5)
    with pytest.raises(ValueError) as info:
        other.load_state_dict(state)
    message = str(info.value)
    for part in (
        "dataset_size: saved 100, this sampler 120",
        "num_replicas: saved 2, this sampler 4",
        "seed: saved 3, this sampler 5",
    ):
        assert part in message
    with pytest.raises(ValueError, match=r"missing keys \['consumed'\]"):
        DistributedSampler(100, num_replicas=2, rank=1, seed=3).load_state_dict(
            {k: v for k, v in state.items() if k != "consumed"}
        )
    with pytest.raises(ValueError, match=r"'consumed' must be an int in \[0, 50\], got 51"):
        DistributedSampler(100, num_replicas=2, rank=1, seed=3).load_state_dict(dict(state, consumed=51))


def test_a_new_pass_starts_the_epoch_over_as_torch_does():
    data = torch.arange(40.0)
    for workers in (0, 2):
        ours = DistributedSampler(40, num_replicas=2, rank=1, seed=3)
        theirs = torch.utils.data.DistributedSampler(range(40), num_replicas=2, rank=1, seed=3)
        counts = []
        for sampler in (ours, theirs):
            loader = DataLoader(TensorDataset(data), batch_size=4, sampler=sampler, num_workers=workers)
            sampler.set_epoch(0)
            next(iter(loader))  # a peek
            seen = [x for (batch,) in loader for x in batch.tolist()]
            for i, _ in enumerate(loader):  # a pass left early, then the same epoch again
                if i == 1:
                    break
            sampler.set_epoch(0)
            again = [x for (batch,) in loader for x in batch.tolist()]
            counts.append((seen, again))
        assert counts[0] == counts[1] and len(counts[0][0]) == 20


def test_an_abandoned_pass_does_not_move_a_newer_one():
    sampler = DistributedSampler(10, num_replicas=1, rank=0, shuffle=False)
    old = iter(sampler)
    next(old), next(old)
    new = iter(sampler)
    assert [next(new), next(old), next(new)] == [0, 2, 1]
    assert sampler.state_dict()["consumed"] == 2  # the position of the pass that yielded last
