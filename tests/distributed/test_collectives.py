"""Every collective at world sizes 2 and 3, sync and async, against one-process math."""

from __future__ import annotations

import pytest
import torch

import clorch.distributed as cd
from tests.harness import run_ranks

pytestmark = pytest.mark.timeout(120)


def _inputs(world_size: int, shape=(4, 3), dtype=torch.float64) -> list[torch.Tensor]:
    """Every rank's input, reproducible in any process: random, never zeros or ones."""
    gen = torch.Generator().manual_seed(1234)
    return [torch.randn(shape, generator=gen, dtype=dtype) + 0.5 for _ in range(world_size)]


def _maybe_wait(work, async_op):
    if async_op:
        assert isinstance(work, cd.Work)
        cd.wait(work)
    else:
        assert work is None


def _all_collectives(rank: int, world_size: int, async_op: bool) -> None:
    xs = _inputs(world_size)
    stacked = torch.stack(xs)
    expected = {
        "sum": stacked.sum(0),
        "avg": stacked.mean(0),
        "min": stacked.min(0).values,
        "max": stacked.max(0).values,
        "product": stacked.prod(0),
    }
    for op, want in expected.items():
        t = xs[rank].clone()
        _maybe_wait(cd.all_reduce(t, op=op, async_op=async_op), async_op)
        torch.testing.assert_close(t, want, msg=f"all_reduce {op}")

        t = xs[rank].clone()
        _maybe_wait(cd.reduce(t, dst=world_size - 1, op=op, async_op=async_op), async_op)
        if rank == world_size - 1:
            torch.testing.assert_close(t, want, msg=f"reduce {op}")

    t = xs[rank].clone()
    _maybe_wait(cd.broadcast(t, src=1, async_op=async_op), async_op)
    torch.testing.assert_close(t, xs[1])

    out = torch.empty(4 * world_size, 3, dtype=torch.float64)
    _maybe_wait(cd.all_gather_into(out, xs[rank], async_op=async_op), async_op)
    torch.testing.assert_close(out, torch.cat(xs))

    big = _inputs(world_size, shape=(2 * world_size, 3))
    for op in ("sum", "avg", "max"):
        out = torch.empty(2, 3, dtype=torch.float64)
        _maybe_wait(cd.reduce_scatter_into(out, big[rank].clone(), op=op, async_op=async_op), async_op)
        full = {"sum": torch.stack(big).sum(0), "avg": torch.stack(big).mean(0), "max": torch.stack(big).max(0).values}[
            op
        ]
        torch.testing.assert_close(out, full[2 * rank : 2 * rank + 2], msg=f"reduce_scatter {op}")

    # all_to_all with uneven splits: rank r sends (d + 1) rows to rank d.
    rows_in = [d + 1 for d in range(world_size)]
    sources = [torch.arange(sum(rows_in), dtype=torch.float64) * 10 + r + 0.25 for r in range(world_size)]
    rows_out = [rank + 1] * world_size
    out = torch.empty(sum(rows_out), dtype=torch.float64)
    _maybe_wait(cd.all_to_all_single(out, sources[rank], rows_out, rows_in, async_op=async_op), async_op)
    start = sum(rows_in[:rank])
    want = torch.cat([sources[s][start : start + rank + 1] for s in range(world_size)])
    torch.testing.assert_close(out, want)

    # point to point: a ring.
    t = xs[rank].clone()
    got = torch.empty_like(t)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    if rank % 2 == 0:
        _maybe_wait(cd.send(t, right, async_op=async_op), async_op)
        _maybe_wait(cd.recv(got, left, async_op=async_op), async_op)
    else:
        _maybe_wait(cd.recv(got, left, async_op=async_op), async_op)
        _maybe_wait(cd.send(t, right, async_op=async_op), async_op)
    torch.testing.assert_close(got, xs[left])

    _maybe_wait(cd.barrier(async_op=async_op), async_op)


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("async_op", [False, True])
def test_every_collective_matches_single_process_math(world_size, async_op):
    run_ranks(_all_collectives, world_size, async_op)


def _queries(rank: int, world_size: int) -> dict:
    return {
        "rank": cd.rank(),
        "world_size": cd.world_size(),
        "local_rank": cd.local_rank(),
        "local_world_size": cd.local_world_size(),
        "backend": cd.backend(),
        "initialized": cd.is_initialized(),
    }


def test_queries_inside_a_group():
    results = run_ranks(_queries, 2)
    for rank, got in enumerate(results):
        assert got == {
            "rank": rank,
            "world_size": 2,
            "local_rank": rank,
            "local_world_size": 2,
            "backend": "gloo",
            "initialized": True,
        }


def test_queries_outside_a_group_answer_rank_zero_of_one():
    assert (cd.rank(), cd.world_size(), cd.local_rank(), cd.local_world_size()) == (0, 1, 0, 1)
    assert cd.backend() is None and not cd.is_initialized()
