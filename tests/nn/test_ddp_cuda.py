"""GPU tier: the reducer and scaler on CUDA with NCCL, and their host-sync budget."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.harness import run_ranks

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(120)]


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 8)
    ).cuda()


def _data(steps):
    gen = torch.Generator().manual_seed(3)
    return [(torch.randn(32, 64, generator=gen).cuda(), torch.randn(32, 8, generator=gen).cuda()) for _ in range(steps)]


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


def _strategy(ddp, opt, precision=None):
    """The `DDPStrategy` that steps clorch's DDP through `precision` (fp32 unless given): clorch's one step path."""
    from clorch.amp import MixedPrecision
    from clorch.strategies import adopt

    precision = MixedPrecision("fp32", "cuda") if precision is None else precision
    return adopt(ddp, ddp.module, opt, precision, torch.device("cuda"))


def _nccl_checks(rank, world_size):
    """DDP with the scaler on NCCL ranks that all train on the same batches.

    The average of identical gradients is the plain gradient, so the bucket
    path must match one plain model, step by step.
    """
    from clorch.amp import GradScaler, MixedPrecision, autocast
    from clorch.nn.parallel import DistributedDataParallel

    out = {}
    data = _data(4)
    plain = _model()
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.05)
    plain_scaler = GradScaler("cuda", init_scale=1024.0)
    ddp = DistributedDataParallel(_model(), bucket_cap_mb=0.1, first_bucket_cap_mb=0.01)
    assert len(ddp.buckets) > 1
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    scaler = GradScaler("cuda", init_scale=1024.0)
    strategy = _strategy(ddp, opt, MixedPrecision("fp16", "cuda", scaler=scaler))
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
            return strategy.optimizer_step()

        syncs.append(_host_syncs(ddp_step))
    for p, q in zip(ddp.module.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q)
    out["syncs_with_scaler"] = syncs

    bf16 = DistributedDataParallel(_model(), reduce_dtype="bf16")
    assert all(b.comm.dtype == torch.bfloat16 for b in bf16.buckets)
    opt = torch.optim.SGD(bf16.parameters(), lr=0.05)
    bf16_strategy = _strategy(bf16, opt)
    x, y = data[0]

    def bf16_step():
        torch.nn.functional.mse_loss(bf16(x), y).backward()
        bf16_strategy.optimizer_step()

    bf16_step()
    out["syncs_without_scaler"] = _host_syncs(bf16_step)
    return out


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="DDP's bucket path runs at 2 ranks: needs 2 CUDA GPUs")
def test_bucket_path_on_nccl_matches_plain_and_syncs_once_per_step():
    for out in run_ranks(_nccl_checks, 2, backend="nccl", timeout=100):
        assert out["syncs_with_scaler"] == [1, 1, 1, 1]  # the scaler's one step-or-skip read
        assert out["syncs_without_scaler"] == 0


def _reducer_checks(rank, world_size):
    """The reducer itself on one NCCL rank (DDP builds none there): real all-reduces, no host sync."""
    import torch.distributed as dist

    from clorch.nn.parallel.reducer import Reducer

    out = {}
    plain, model = _model(), _model()
    named = list(model.named_parameters())
    x, y = _data(1)[0]
    dist.all_reduce(torch.zeros(1, device="cuda"))  # NCCL sets up its communicator on first use
    for reduce_dtype in (None, torch.bfloat16):
        reducer = Reducer([p for _, p in named], [n for n, _ in named], 0.1, 0.01, reduce_dtype, world_size)
        plain.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(plain(x), y).backward()
        syncs = _host_syncs(lambda: torch.nn.functional.mse_loss(model(x), y).backward())
        flats = {b.flat.data_ptr() for b in reducer.buckets}
        tol = {} if reduce_dtype is None else {"rtol": 2e-2, "atol": 1e-3}
        for p, q in zip(model.parameters(), plain.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **tol)
        out[str(reduce_dtype)] = {
            "buckets": len(reducer.buckets),
            "syncs": syncs,
            "committed": reducer.committed,
            "comm_dtypes": sorted({str(b.comm.dtype) for b in reducer.buckets}),
            "views": all(p.grad._base is not None and p.grad._base.data_ptr() in flats for p in model.parameters()),
        }
        reducer.remove()
    return out


def test_reducer_on_one_nccl_rank_averages_into_bucket_views_without_host_sync():
    (out,) = run_ranks(_reducer_checks, 1, backend="nccl", timeout=100)
    for name, comm in (("None", "torch.float32"), ("torch.bfloat16", "torch.bfloat16")):
        got = out[name]
        assert got["buckets"] > 1 and got["comm_dtypes"] == [comm]
        assert got["views"] is True and got["committed"] is True
        assert got["syncs"] == 0


def _step_in_backward_checks(rank, world_size, overlap_grad_copies):
    """Fused AdamW stepped bucket by bucket on a side stream == a fused step after backward."""
    from clorch.nn.parallel import DistributedDataParallel

    plain, ddp = (
        _model(),
        DistributedDataParallel(
            _model(), bucket_cap_mb=0.1, first_bucket_cap_mb=0.01, overlap_grad_copies=overlap_grad_copies
        ),
    )
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-3, fused=True)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3, fused=True)
    ddp.step_in_backward(opt)
    strategy = _strategy(ddp, opt)
    syncs = []
    for x, y in _data(4):  # every rank trains on the same batches: the average is the plain gradient
        torch.nn.functional.mse_loss(plain(x), y).backward()
        plain_opt.step()
        plain_opt.zero_grad(set_to_none=True)

        def step():
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            strategy.optimizer_step()

        syncs.append(_host_syncs(step))
    same = all(torch.equal(p, q) for p, q in zip(ddp.module.parameters(), plain.parameters()))
    return {"buckets": len(ddp.buckets), "same": same, "syncs": syncs}


@pytest.mark.parametrize("overlap_grad_copies", [False, True])
@pytest.mark.parametrize("world_size", [1, 2])
def test_step_in_backward_on_nccl_is_bit_identical_and_sync_free(world_size, overlap_grad_copies):
    if torch.cuda.device_count() < world_size:
        pytest.skip(f"needs {world_size} CUDA GPUs")
    for out in run_ranks(_step_in_backward_checks, world_size, overlap_grad_copies, backend="nccl", timeout=100):
        assert out["buckets"] > 1
        assert out["same"] is True
        assert out["syncs"] == [0, 0, 0, 0]


def _fp16_steps(make_scaler, fused_opt_model, data, overflow_at, step_fn):
    """Train fp16 with a scaler; the loss is made inf at step `overflow_at` (an overflow to skip)."""
    from clorch.amp import autocast

    model, opt = fused_opt_model
    scaler = make_scaler()
    syncs = []
    for index, (x, y) in enumerate(data):

        def one_step():
            with autocast("cuda", dtype=torch.float16):
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
            if index == overflow_at:
                loss = loss * float("inf")
            scaler.scale(loss).backward()
            step_fn(model, opt, scaler)
            opt.zero_grad(set_to_none=True)

        syncs.append(_host_syncs(one_step))
    return model, scaler, syncs


def _fused(seed=0):
    model = _model(seed)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)


def _scaler_step(model, opt, scaler):
    scaler.step(opt)
    scaler.update()


def test_fp16_step_with_a_fused_optimizer_never_syncs_and_matches_torch_gradscaler():
    from clorch.amp import GradScaler

    data = _data(5)
    ours, scaler, syncs = _fp16_steps(
        lambda: GradScaler("cuda", init_scale=1024.0, growth_interval=2), _fused(), data, 2, _scaler_step
    )
    theirs, torch_scaler, _ = _fp16_steps(
        lambda: torch.amp.GradScaler("cuda", init_scale=1024.0, growth_interval=2), _fused(), data, 2, _scaler_step
    )
    assert syncs == [0, 0, 0, 0, 0]  # the skip at step 2 was decided on the device
    assert all(torch.equal(p, q) for p, q in zip(ours.parameters(), theirs.parameters()))
    assert scaler.get_scale() == torch_scaler.get_scale()
    assert scaler.skipped_steps == 1 and scaler.state_dict()["_growth_tracker"] == torch_scaler._get_growth_tracker()


def _fp16_ddp_checks(rank, world_size):
    """DDP + fused AdamW + the scaler: rank 1 alone overflows at step 2, every rank skips it, no sync."""
    from clorch.amp import GradScaler, MixedPrecision
    from clorch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(_model(), bucket_cap_mb=0.1, first_bucket_cap_mb=0.01)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3, fused=True)

    def strategy_step(model, optimizer, scaler):
        _strategy(model, optimizer, MixedPrecision("fp16", "cuda", scaler=scaler)).optimizer_step()

    _, scaler, syncs = _fp16_steps(
        lambda: GradScaler("cuda", init_scale=1024.0),
        (ddp, opt),
        _data(4),
        2 if rank == 1 else -1,
        strategy_step,
    )
    weights = torch.cat([p.detach().flatten() for p in ddp.parameters()]).cpu()
    return {"syncs": syncs, "skipped": scaler.skipped_steps, "scale": scaler.get_scale(), "weights": weights}


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_fp16_ddp_with_a_fused_optimizer_skips_together_without_host_syncs():
    outs = run_ranks(_fp16_ddp_checks, 2, backend="nccl", timeout=100)
    for out in outs:
        assert out["syncs"] == [0, 0, 0, 0]
        assert out["skipped"] == 1 and out["scale"] == 512.0
    assert torch.equal(outs[0]["weights"], outs[1]["weights"])


def _delay_copies(reducer):
    """Make the side stream's copies land late (about 50 ms), so a missing stream wait shows."""
    copy_pending = reducer._filler.copy_pending

    def late(bucket):
        torch.cuda._sleep(50_000_000)  # queued on the copy stream, before the copies
        copy_pending(bucket)

    reducer._filler.copy_pending = late


def _bucket_path_checks(rank, world_size):
    """The whole CUDA bucket path on one NCCL rank, all-reduce to itself, with and without overlap_grad_copies."""
    from clorch.nn.parallel import DistributedDataParallel
    from clorch.nn.parallel.reducer import Reducer

    mse = torch.nn.functional.mse_loss
    out = {}
    data = _data(3)
    variants = (("default", {}), ("views", {"gradient_as_bucket_view": True}), ("bf16", {"reduce_dtype": "bf16"}))
    for name, kwargs in [
        (f"{name} {side}", {**kwargs, "overlap_grad_copies": side})
        for name, kwargs in variants
        for side in (False, True)
    ]:
        plain = _model()
        ddp = DistributedDataParallel(_model(), bucket_cap_mb=0.1, first_bucket_cap_mb=0.01, **kwargs)
        ddp._run_bucket_path()
        if kwargs["overlap_grad_copies"]:
            _delay_copies(ddp._reducer)  # whatever reads a bucket before its copies land fails below
        plain_opt, opt = torch.optim.SGD(plain.parameters(), lr=0.05), torch.optim.SGD(ddp.parameters(), lr=0.05)
        strategy = _strategy(ddp, opt)
        tol = {"rtol": 2e-2, "atol": 1e-3} if name.startswith("bf16") else {"rtol": 0, "atol": 0}
        syncs = []
        for step, (x, y) in enumerate(data):
            micro = [(x, y), (x * 0.5, y)] if step == 1 else [(x, y)]  # step 1 accumulates two
            for mx, my in micro:
                mse(plain(mx), my).backward()

            def ddp_step():
                for index, (mx, my) in enumerate(micro):
                    if index < len(micro) - 1:
                        with ddp.no_sync():
                            mse(ddp(mx), my).backward()
                    else:
                        mse(ddp(mx), my).backward()

            syncs.append(_host_syncs(ddp_step))
            for p, q in zip(ddp.module.parameters(), plain.parameters()):
                torch.testing.assert_close(p.grad, q.grad, **tol)
            strategy.optimizer_step()
            plain_opt.step()
            plain_opt.zero_grad(set_to_none=True)
        out[name] = {"buckets": len(ddp.buckets), "syncs": syncs}
        ddp.close()

    # A reducer told of 3 ranks over this 1-rank group divides every gradient by 3 before the sum:
    # new gradients (copied), accumulated ones (in place) and bf16 buckets (converted, rounded
    # once: divided in float32, then converted) alike.
    for reduce_dtype, side in [(d, s) for d in (None, torch.bfloat16) for s in (False, True)]:
        model, plain = _model(), _model()
        named = list(model.named_parameters())
        reducer = Reducer(
            [p for _, p in named],
            [n for n, _ in named],
            0.1,
            0.01,
            reduce_dtype,
            3,
            communicate=True,
            overlap_grad_copies=side,
        )
        if side:
            _delay_copies(reducer)
        x, y = data[0]
        for views in (False, True):  # the second backward accumulates into the bucket views
            plain.zero_grad(set_to_none=True)
            mse(plain(x), y).backward()
            if views:
                for p in model.parameters():
                    p.grad.zero_()
            mse(model(x), y).backward()
            out[f"divided {reduce_dtype} {side} {views}"] = all(
                torch.equal(p.grad, (q.grad / 3).to(p.grad.dtype if reduce_dtype is None else reduce_dtype).float())
                for p, q in zip(model.parameters(), plain.parameters())
            )
        reducer.remove()
    return out


def test_bucket_path_on_one_nccl_rank_matches_plain_gradients_without_host_syncs():
    (out,) = run_ranks(_bucket_path_checks, 1, backend="nccl", timeout=100)
    runs = [key for key in out if not key.startswith("divided")]
    assert len(runs) == 6
    for name in runs:
        assert out[name]["buckets"] > 1
        assert out[name]["syncs"] == [0, 0, 0], name
    assert len(out) == 6 + 8
    assert [key for key, value in out.items() if key.startswith("divided") and value is not True] == []


class _LateOnItsStream(torch.autograd.Function):
    """Identity whose backward sleeps (about 50 ms) on the stream it runs on."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        torch.cuda._sleep(50_000_000)
        return grad


def _first_layer_on(stream, model, x):
    """model(x) with its first layer on `stream`: backward makes that layer's gradients there, late."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        h = _LateOnItsStream.apply(model[0](x))
    torch.cuda.current_stream().wait_stream(stream)
    return model[1:](h)


def _two_stream_checks(rank, world_size):
    """Gradients made on two streams in one backward: every copy, all-reduce and .grad is ordered."""
    from clorch.nn.parallel.reducer import Reducer

    mse = torch.nn.functional.mse_loss
    side = torch.cuda.Stream()
    x, y = _data(1)[0]
    plain = _model()
    mse(_first_layer_on(side, plain, x), y).backward()
    out = {}
    for divisor, communicate in ((1, True), (3, False)):
        for overlap in (False, True):
            model = _model()
            named = list(model.named_parameters())
            reducer = Reducer(
                [p for _, p in named],
                [n for n, _ in named],
                0.1,
                0.01,
                None,
                divisor,
                communicate=communicate,
                overlap_grad_copies=overlap,
            )
            elsewhere = []
            copy_on_other = reducer._filler.copy_now
            reducer._filler.copy_now = lambda *args: (elsewhere.append(1), copy_on_other(*args))
            mse(_first_layer_on(side, model, x), y).backward()
            same = all(torch.equal(p.grad, q.grad / divisor) for p, q in zip(model.parameters(), plain.parameters()))
            out[f"{divisor} {overlap}"] = {"same": same, "copied elsewhere": len(elsewhere)}
            reducer.remove()
    return out


def test_gradients_made_on_another_stream_are_waited_for():
    (out,) = run_ranks(_two_stream_checks, 1, backend="nccl", timeout=100)
    print("two streams:", out)
    assert len(out) == 4
    for name, got in out.items():
        assert got["same"] is True, (name, got)
        assert got["copied elsewhere"] == 2, (name, got)  # the first layer's weight and bias
