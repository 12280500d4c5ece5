"""GPU tier: clorch's DDP reducer, autocast, the loss scaler and checkpoints on CUDA over nccl."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import clorch.distributed as cd
from tests.harness import run_ranks

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(300)]

WORLD_SIZES = list(range(1, torch.cuda.device_count() + 1)) or [1]


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 8))


def _data(world_size: int, steps: int, per_rank: int = 4):
    gen = torch.Generator().manual_seed(7)
    return [
        (torch.randn(world_size * per_rank, 32, generator=gen), torch.randn(world_size * per_rank, 8, generator=gen))
        for _ in range(steps)
    ]


def _strategy(model, opt, precision, rank: int, world_size: int):
    """The `DDPStrategy` that steps clorch's DDP `model` through `precision` (clorch's one step path)."""
    from clorch.strategies import adopt

    return adopt(model, model.module, opt, precision, cd.device(), rank, world_size)


def _ddp_matches_reference(rank: int, world_size: int, reduce_dtype) -> float:
    from clorch.amp import MixedPrecision
    from clorch.nn.parallel import DistributedDataParallel

    dev = cd.device()
    data = _data(world_size, steps=4)
    reference = _model().to(dev)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    # World size 1 takes DDP's fast path (no hooks); 2 or more ranks run the tiny buckets.
    model = DistributedDataParallel(
        _model().to(dev), bucket_cap_mb=0.005, first_bucket_cap_mb=0.001, reduce_dtype=reduce_dtype
    )
    assert (len(model.buckets) > 1) == (world_size > 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy = _strategy(model, opt, MixedPrecision("fp32", dev), rank, world_size)
    for x, y in data:
        x, y = x.to(dev), y.to(dev)
        nn.functional.mse_loss(reference(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
        shard = slice(rank * 4, rank * 4 + 4)
        nn.functional.mse_loss(model(x[shard]), y[shard]).backward()
        assert strategy.optimizer_step() is True
    worst = max((a - b).abs().max().item() for a, b in zip(model.module.parameters(), reference.parameters()))
    return worst


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("reduce_dtype", [None, "bf16"])
def test_ddp_on_cuda_matches_one_process_on_the_whole_batch(world_size, reduce_dtype):
    tolerance = 1e-5 if reduce_dtype is None else 5e-3
    for worst in run_ranks(_ddp_matches_reference, world_size, reduce_dtype, backend="nccl", timeout=240):
        assert worst < tolerance


def _scaler_overflow(rank: int, world_size: int) -> dict:
    from clorch.amp import GradScaler, MixedPrecision, autocast, backward
    from clorch.nn.parallel import DistributedDataParallel

    dev = cd.device()
    model = DistributedDataParallel(_model().to(dev))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler("cuda", init_scale=1024.0, growth_interval=3)
    strategy = _strategy(model, opt, MixedPrecision("fp16", dev, scaler=scaler), rank, world_size)
    x, y = (t.to(dev) for t in _data(world_size, 1)[0])
    before = copy.deepcopy(model.module.state_dict())
    with autocast("cuda", dtype=torch.float16):
        out = model(x[rank * 4 : rank * 4 + 4])
        assert out.dtype == torch.float16
        loss = nn.functional.mse_loss(out.float(), y[rank * 4 : rank * 4 + 4])
    backward(scaler, loss)
    if rank == world_size - 1:  # one rank overflows: every rank must skip
        next(model.module.parameters()).grad[0, 0] = float("inf")
    stepped = strategy.optimizer_step()
    unchanged = all(torch.equal(before[k], v) for k, v in model.module.state_dict().items())
    result = {
        "stepped": stepped,
        "unchanged": unchanged,
        "scale": scaler.get_scale(),
        "skipped": scaler.skipped_steps,
        "last_skipped": scaler.last_step_skipped,
    }
    for _ in range(3):  # three clean steps: the scale grows once
        with autocast("cuda", dtype=torch.float16):
            loss = nn.functional.mse_loss(model(x[rank * 4 : rank * 4 + 4]).float(), y[rank * 4 : rank * 4 + 4])
        backward(scaler, loss)
        strategy.optimizer_step()
    result["grown_scale"] = scaler.get_scale()
    with autocast("cuda", dtype=torch.bfloat16):
        result["bf16_dtype"] = str(model(x[:4]).dtype)
    result["autocast_after"] = torch.is_autocast_enabled("cuda")
    return result


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_fp16_overflow_skips_the_step_on_every_rank_and_halves_the_scale(world_size):
    for got in run_ranks(_scaler_overflow, world_size, backend="nccl", timeout=240):
        assert got["stepped"] is False and got["unchanged"] is True
        assert got["scale"] == 512.0 and got["skipped"] == 1 and got["last_skipped"] is True
        assert got["grown_scale"] == 1024.0
        assert got["bf16_dtype"] == "torch.bfloat16" and got["autocast_after"] is False


def _checkpoint_cuda_rng(rank: int, world_size: int, path: str) -> bool:
    from clorch.checkpoint import load_checkpoint, save_checkpoint

    dev = cd.device()
    model = _model().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    nn.functional.mse_loss(model(torch.randn(4, 32, device=dev)), torch.randn(4, 8, device=dev)).backward()
    opt.step()
    torch.cuda.manual_seed(1000 + rank)
    save_checkpoint(path, model=model, optimizer=opt, state={"step": 1})
    expected = torch.randn(16, device=dev)  # the CUDA stream right after the save
    weights = copy.deepcopy(model.state_dict())
    torch.cuda.manual_seed(99)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    state = load_checkpoint(path, model=model, optimizer=opt)
    again = torch.randn(16, device=dev)
    same_weights = all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    return state["step"] == 1 and same_weights and torch.equal(expected, again)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_checkpoint_restores_weights_and_cuda_rng(world_size, tmp_path):
    results = run_ranks(_checkpoint_cuda_rng, world_size, str(tmp_path / "model.ckpt"), backend="nccl", timeout=240)
    assert all(results)
