"""GPU tier: nccl process groups and every collective on CUDA tensors.

Runs at every world size from 1 to the number of visible GPUs (one rank per GPU).
"""

from __future__ import annotations

import pytest
import torch

import clorch.distributed as cd
from tests.distributed.test_collectives import _inputs
from tests.harness import run_ranks

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(300)]

WORLD_SIZES = list(range(1, torch.cuda.device_count() + 1)) or [1]


def _nccl_collectives(rank: int, world_size: int, async_op: bool) -> dict:
    assert cd.backend() == "nccl" and cd.device().type == "cuda"
    dev = cd.device()
    xs = [x.to(dev) for x in _inputs(world_size, dtype=torch.float32)]
    stacked = torch.stack(xs)
    done = lambda w: cd.wait(w) if async_op else None  # noqa: E731
    expected = {
        "sum": stacked.sum(0),
        "avg": stacked.mean(0),
        "min": stacked.min(0).values,
        "max": stacked.max(0).values,
        "product": stacked.prod(0),
    }
    for op, want in expected.items():
        t = xs[rank].clone()
        done(cd.all_reduce(t, op=op, async_op=async_op))
        torch.testing.assert_close(t, want, msg=f"all_reduce {op}")
        t = xs[rank].clone()
        done(cd.reduce(t, dst=0, op=op, async_op=async_op))
        if rank == 0:
            torch.testing.assert_close(t, want, msg=f"reduce {op}")
    t = xs[rank].clone()
    done(cd.broadcast(t, src=world_size - 1, async_op=async_op))
    torch.testing.assert_close(t, xs[-1])
    out = torch.empty(4 * world_size, 3, device=dev)
    done(cd.all_gather_into(out, xs[rank], async_op=async_op))
    torch.testing.assert_close(out, torch.cat(xs))
    big = [b.to(dev) for b in _inputs(world_size, shape=(2 * world_size, 3), dtype=torch.float32)]
    out = torch.empty(2, 3, device=dev)
    done(cd.reduce_scatter_into(out, big[rank].clone(), op="avg", async_op=async_op))
    torch.testing.assert_close(out, torch.stack(big).mean(0)[2 * rank : 2 * rank + 2])
    src = torch.arange(2 * world_size, dtype=torch.float32, device=dev) + 100 * rank
    out = torch.empty_like(src)
    done(cd.all_to_all_single(out, src, async_op=async_op))
    want = torch.cat(
        [
            torch.arange(2 * world_size, dtype=torch.float32, device=dev)[2 * rank : 2 * rank + 2] + 100 * s
            for s in range(world_size)
        ]
    )
    torch.testing.assert_close(out, want)
    if world_size > 1:
        t, got = xs[rank].clone(), torch.empty_like(xs[rank])
        right, left = (rank + 1) % world_size, (rank - 1) % world_size
        if rank % 2 == 0:
            done(cd.send(t, right, async_op=async_op))
            done(cd.recv(got, left, async_op=async_op))  # noqa: E702
        else:
            done(cd.recv(got, left, async_op=async_op))
            done(cd.send(t, right, async_op=async_op))  # noqa: E702
        torch.testing.assert_close(got, xs[left])
    done(cd.barrier(async_op=async_op))
    torch.cuda.synchronize()
    # A CPU tensor is refused on nccl before anything is sent.
    try:
        cd.all_reduce(torch.ones(2))
    except ValueError as exc:
        wrong_device = str(exc)
    return {"device": str(dev), "wrong_device": wrong_device, "local_rank": cd.local_rank()}


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("async_op", [False, True])
def test_every_collective_on_cuda(world_size, async_op):
    results = run_ranks(_nccl_collectives, world_size, async_op, backend="nccl", timeout=240)
    for rank, got in enumerate(results):
        assert got["device"].startswith("cuda")
        assert "must be on cuda" in got["wrong_device"] and "backend nccl" in got["wrong_device"]


def _same_device_twice(rank: int, world_size: int) -> str:
    try:
        cd.init_process_group(backend="nccl", timeout=60)
    except ValueError as exc:
        return str(exc)
    cd.destroy_process_group()
    return "no error"


def test_two_local_ranks_on_one_device_is_refused():
    # Both ranks see only GPU 0: nccl would hang or fail obscurely; clorch refuses first.
    messages = run_ranks(_same_device_twice, 2, init_group=False, env={"CUDA_VISIBLE_DEVICES": "0"}, timeout=120)
    for message in messages:
        assert "share CUDA device" in message and "ranks [0, 1]" in message
