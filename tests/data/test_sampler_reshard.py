"""An epoch continued on another world size, taken in steps and micro-batches as clorch's loop takes them.

The engine's loop (`clorch.train.loop.fit`) cuts each rank's `sample_indices()` into
optimizer steps of batch_size x accumulation indices and those into micro-batches of
batch_size, and advances the sampler after each step. These tests run that cutting
(its own `_step_chunks`) on a world of W ranks for k steps, save the job's position,
and continue on W' ranks with the accumulation that keeps the global batch: every
later optimizer step must hold exactly the samples of the uninterrupted run's step,
in full micro-batches, and the next epoch must be the uninterrupted run's too.
"""

from __future__ import annotations

import itertools

import pytest

from clorch.data.sampler import DistributedSampler, accumulation_for
from clorch.train.loop import _step_chunks

pytestmark = pytest.mark.timeout(60)

SEED, BATCH = 5, 4


def _world(size: int, ranks: int, drop_last: bool, epoch: int = 0) -> list[DistributedSampler]:
    samplers = [
        DistributedSampler(size, num_replicas=ranks, rank=r, seed=SEED, drop_last=drop_last) for r in range(ranks)
    ]
    for sampler in samplers:
        sampler.set_epoch(epoch)
    return samplers


def _train(samplers: list[DistributedSampler], accumulation: int, steps: int | None = None) -> list[list[list[int]]]:
    """Up to `steps` optimizer steps of the current epoch as the loop takes them:
    for each step, every rank's micro-batches (rank by rank); the samplers advance."""
    chunks = [_step_chunks(s.sample_indices(), BATCH * accumulation, BATCH) for s in samplers]
    count = len(chunks[0]) if steps is None else steps
    taken = []
    for n in range(count):
        step = [chunks[r][n] for r in range(len(samplers))]
        for sampler, micro in zip(samplers, step):
            sampler.advance(sum(len(m) for m in micro))
        taken.append([m for rank in step for m in rank])
    return taken


def _continued(state: dict, size: int, ranks: int, drop_last: bool) -> list[DistributedSampler]:
    samplers = _world(size, ranks, drop_last)
    for sampler in samplers:
        sampler.load_global_state_dict(state)
        sampler.set_epoch(state["epoch"])  # the loop's call on a new pass keeps the position
    return samplers


def _the_state(samplers: list[DistributedSampler]) -> dict:
    states = [s.global_state_dict() for s in samplers]
    assert all(s == states[0] for s in states)  # the ranks agree (a sharded checkpoint checks it)
    return states[0]


CASES = [
    # (old ranks, old accumulation, new ranks, samples): global batch = BATCH x ranks x accumulation
    (2, 1, 1, 64),
    (1, 2, 2, 64),
    (2, 2, 4, 64),
    (4, 1, 2, 64),
    (3, 2, 2, 72),
    (2, 3, 3, 72),
    (2, 1, 1, 70),  # 70 is not a multiple of the global batch 8: a partial last step
    (3, 1, 1, 50),
]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("old, accumulation, new, size", CASES)
def test_each_later_step_holds_the_uninterrupted_steps_samples(old, accumulation, new, size, drop_last):
    global_batch = BATCH * old * accumulation
    kept = accumulation_for(global_batch, BATCH, new)
    uninterrupted = _train(_world(size, old, drop_last), accumulation)
    for done in range(1, len(uninterrupted)):
        before = _world(size, old, drop_last)
        _train(before, accumulation, done)
        after = _continued(_the_state(before), size, new, drop_last)
        steps = _train(after, kept)
        full = [s for s in uninterrupted[done:] if sum(map(len, s)) == global_batch]
        for mine, theirs in zip(steps, full):
            assert sorted(itertools.chain(*mine)) == sorted(itertools.chain(*theirs)), (done, mine, theirs)
            assert len(mine) == new * kept and all(len(m) == BATCH for m in mine)
        left = sorted(itertools.chain(*itertools.chain(*uninterrupted[done:])))
        seen = sorted(itertools.chain(*itertools.chain(*steps)))
        if size % global_batch == 0:
            # Every remaining sample once, in the uninterrupted run's steps, and no more steps.
            assert seen == left and len(steps) == len(uninterrupted) - done
        elif drop_last:  # the tail the new world size cannot split is dropped
            assert set(seen) <= set(left) and len(seen) == len(set(seen))
        else:  # ... or padded by repeating samples of the epoch
            assert set(seen) >= set(left) - {i for s in uninterrupted[:done] for m in s for i in m}
            assert len(seen) - len(left) < new * BATCH


@pytest.mark.parametrize("old, accumulation, new, size", [c for c in CASES if c[3] % (BATCH * c[0] * c[1]) == 0])
def test_the_next_epoch_is_the_uninterrupted_runs(old, accumulation, new, size):
    kept = accumulation_for(BATCH * old * accumulation, BATCH, new)
    reference = _world(size, old, False, epoch=1)
    before = _world(size, old, False)
    _train(before, accumulation, 2)
    after = _continued(_the_state(before), size, new, False)
    _train(after, kept)  # the rest of epoch 0
    for sampler in after:
        sampler.set_epoch(1)
        assert not sampler.continues_another_world_size
    expected = [sorted(itertools.chain(*s)) for s in _train(reference, accumulation)]
    assert [sorted(itertools.chain(*s)) for s in _train(after, kept)] == expected


def test_a_continued_epoch_saved_again_continues_on_a_third_world_size():
    size, global_batch = 96, 24  # a multiple of 1, 2, 3 and 6 ranks' steps
    uninterrupted = [sorted(itertools.chain(*s)) for s in _train(_world(size, 2, False), 3)]
    first = _world(size, 2, False)
    _train(first, 3, 1)
    second = _continued(_the_state(first), size, 3, False)
    assert all(s.continues_another_world_size for s in second)
    with pytest.raises(RuntimeError, match="global_state_dict"):
        second[0].state_dict()  # a checkpoint file then holds the global position only
    taken = _train(second, accumulation_for(global_batch, BATCH, 3), 1)
    third = _continued(_the_state(second), size, 6, False)
    taken += _train(third, accumulation_for(global_batch, BATCH, 6))
    assert [sorted(itertools.chain(*s)) for s in taken] == uninterrupted[1:]


def test_a_rank_state_gives_the_jobs_global_state():
    samplers = _world(40, 4, False)
    _train(samplers, 1, 1)
    for sampler in samplers:
        assert DistributedSampler.global_state_of(sampler.state_dict()) == sampler.global_state_dict()
        assert not sampler.continues_another_world_size
    with pytest.raises(ValueError, match="sampler state has keys"):
        DistributedSampler.global_state_of({"epoch": 0})
