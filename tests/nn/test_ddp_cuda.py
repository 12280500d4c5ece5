"""GPU tier: the reducer and scaler on CUDA with NCCL (one rank), and their host-sync budget."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.harness import run_ranks

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(120)]


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256),
                               torch.nn.GELU(), torch.nn.Linear(256, 8)).cuda()


def _data(steps):
    gen = torch.Generator().manual_seed(3)
    return [(torch.randn(32, 64, generator=gen).cuda(), torch.randn(32, 8, generator=gen).cuda())
            for _ in range(steps)]


def _host_syncs(fn) -> int:
    """How many host-device synchronizations `fn` makes (CUDA sync debug mode, warn level)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchronizing" in str(w.message).lower() for w in caught)


def _nccl_checks(rank, world_size):
    from clorch.amp import GradScaler, autocast
    from clorch.distributed import process_group
    from clorch.nn.parallel import DistributedDataParallel

    out = {}
    with process_group(backend="nccl"):
        data = _data(4)
        plain = _model()
        plain_opt = torch.optim.SGD(plain.parameters(), lr=0.05)
        plain_scaler = GradScaler("cuda", init_scale=1024.0)
        ddp = DistributedDataParallel(_model(), skip_at_world_size_one=False, bucket_cap_mb=0.1,
                                      first_bucket_cap_mb=0.01)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        scaler = GradScaler("cuda", init_scale=1024.0)
        syncs = []
        for x, y in data:
            with autocast("cuda", dtype=torch.float16):
                plain_loss = torch.nn.functional.mse_loss(plain(x).float(), y)
            plain_scaler.scale(plain_loss).backward()
            plain_scaler.step(plain_opt)
            plain_scaler.update()
            plain_opt.zero_grad()

            def ddp_step():
                with autocast("cuda", dtype=torch.float16):
                    loss = torch.nn.functional.mse_loss(ddp(x).float(), y)
                scaler.scale(loss).backward()
                return ddp.optimizer_step(opt, scaler)

            syncs.append(_host_syncs(ddp_step))
        for p, q in zip(ddp.module.parameters(), plain.parameters()):
            torch.testing.assert_close(p, q)
        out["syncs_with_scaler"] = syncs

        bf16 = DistributedDataParallel(_model(), skip_at_world_size_one=False, reduce_dtype="bf16")
        opt = torch.optim.SGD(bf16.parameters(), lr=0.05)
        x, y = data[0]

        def bf16_step():
            torch.nn.functional.mse_loss(bf16(x), y).backward()
            bf16.optimizer_step(opt)

        bf16_step()
        out["syncs_without_scaler"] = _host_syncs(bf16_step)
    return out


def test_bucket_path_on_nccl_matches_plain_and_syncs_once_per_step():
    (out,) = run_ranks(_nccl_checks, 1, init_group=False, timeout=100)
    assert out["syncs_with_scaler"] == [1, 1, 1, 1]  # the scaler's one step-or-skip read
    assert out["syncs_without_scaler"] == 0
