"""The sampler's global position: an epoch continued on another world size keeps every optimizer step's samples."""

from __future__ import annotations

import itertools

import pytest

from clorch.data.sampler import DistributedSampler, accumulation_for

pytestmark = pytest.mark.timeout(60)

SIZE, SEED, EPOCH = 37, 3, 1


def _samplers(world: int, drop_last: bool) -> list[DistributedSampler]:
    samplers = [
        DistributedSampler(SIZE, num_replicas=world, rank=r, seed=SEED, drop_last=drop_last) for r in range(world)
    ]
    for sampler in samplers:
        sampler.set_epoch(EPOCH)
    return samplers


def _steps(samplers: list[DistributedSampler], global_batch: int) -> list[list[int]]:
    """The sets of samples of each full optimizer step left in the epoch (sorted lists)."""
    per_rank = global_batch // len(samplers)
    shares = [s.sample_indices() for s in samplers]
    return [
        sorted(i for share in shares for i in share[n * per_rank : (n + 1) * per_rank])
        for n in range(len(shares[0]) // per_rank)
    ]


def _continued(state: dict, world: int, drop_last: bool) -> list[DistributedSampler]:
    samplers = [
        DistributedSampler(SIZE, num_replicas=world, rank=r, seed=SEED, drop_last=drop_last) for r in range(world)
    ]
    for sampler in samplers:
        sampler.load_global_state_dict(state)
        sampler.set_epoch(EPOCH)  # the usual loop's call keeps the restored position
    return samplers


@pytest.mark.parametrize("drop_last", [False, True])
def test_remaining_steps_are_the_uninterrupted_runs_steps_on_any_world_size(drop_last):
    for old, new, global_batch, done in (
        (2, 1, 8, 2),
        (1, 2, 8, 3),
        (2, 4, 8, 1),
        (4, 2, 8, 2),
        (2, 3, 12, 1),
        (3, 2, 6, 4),
    ):
        case = (old, new, global_batch, done, drop_last)
        before = _samplers(old, drop_last)
        uninterrupted = _steps(before, global_batch)
        for sampler in before:
            sampler.advance(done * global_batch // old)
        [state] = {str(s.global_state_dict()): s.global_state_dict() for s in before}.values()  # ranks agree
        after = _continued(state, new, drop_last)
        steps = _steps(after, global_batch)
        left = uninterrupted[done:]
        assert steps[: len(left)] == left, case
        # Every remaining sample of the epoch once, none of the consumed ones; only the tail that
        # the new world size cannot split is padded (drop_last=False) or dropped (True).
        rest = [i for s in after for i in s.sample_indices()]
        unseen = [i for s in before for i in s.sample_indices()]
        consumed = {i for s in _samplers(old, drop_last) for i in s.sample_indices()[: done * global_batch // old]}
        if drop_last:
            assert len(set(rest)) == len(rest) and set(rest) <= set(unseen), case
            assert len(unseen) - len(rest) < new, case
        else:
            assert set(rest) == set(unseen) and len(rest) - len(unseen) < new, case
            assert set(rest) | consumed == set(range(SIZE)), case
        # Chained: one more step on the new world size, then back to the old one.
        for sampler in after:
            sampler.advance(global_batch // new)
        back = _continued(after[0].global_state_dict(), old, drop_last)
        assert _steps(back, global_batch)[: len(left) - 1] == left[1:], case


def test_same_world_size_round_trips_to_the_ordinary_state():
    samplers = _samplers(2, False)
    for sampler in samplers:
        sampler.advance(5)
    state = samplers[1].global_state_dict()
    assert state["position"] == 10 and state["layout_replicas"] == 2
    [again] = _continued(state, 2, False)[1:]
    assert again.state_dict() == samplers[1].state_dict()
    assert again.sample_indices() == samplers[1].sample_indices()


def test_an_epoch_continued_from_another_world_size_has_no_per_rank_state():
    state = _samplers(2, False)[0].global_state_dict() | {"position": 6}
    [sampler] = _continued(state, 1, False)
    with pytest.raises(RuntimeError, match="global_state_dict"):
        sampler.state_dict()
    sampler.set_epoch(EPOCH + 1)  # the next epoch is this world size's own again
    assert sampler.state_dict()["consumed"] == 0 and len(sampler.sample_indices()) == SIZE


def test_load_global_state_refuses_another_sampler_and_bad_positions():
    state = _samplers(2, False)[0].global_state_dict()
    other = DistributedSampler(SIZE + 1, num_replicas=1, rank=0, seed=SEED + 1)
    with pytest.raises(ValueError, match=r"dataset_size: saved 37, this sampler 38; seed: saved 3"):
        other.load_global_state_dict(state)
    mine = DistributedSampler(SIZE, num_replicas=1, rank=0, seed=SEED)
    with pytest.raises(ValueError, match=r"'position' must be an int in \[0, 38\], got 39"):
        mine.load_global_state_dict(state | {"position": 39})
    with pytest.raises(ValueError, match="misses keys"):
        mine.load_global_state_dict({"epoch": 0})
    assert mine.state_dict()["consumed"] == 0  # nothing changed


def test_accumulation_for_keeps_the_global_batch_or_names_why_not():
    for batch, world, accumulation in itertools.product((1, 2, 4), (1, 2, 4), (1, 2, 3)):
        assert accumulation_for(batch * world * accumulation, batch, world) == accumulation
    with pytest.raises(
        ValueError,
        match=r"global batch 12 cannot be kept on world_size 3 with batch_size 3: "
        r"12 is not a multiple of 3 x 3 = 9; batch_size values that fit: \[1, 2\]",
    ):
        accumulation_for(12, 3, 3)
    with pytest.raises(ValueError, match="no batch_size fits: 5 ranks do not divide 12"):
        accumulation_for(12, 4, 5)
    with pytest.raises(ValueError, match="world_size"):
        accumulation_for(12, 4, 0)
