"""MixedPrecision on the CPU: autocast per mode, backward, the step against torch.amp.GradScaler's
math, state, errors; GradScaler.unscale_flat_; and MixedPrecision through DDP on gloo ranks."""

from __future__ import annotations

import pytest
import torch

from clorch.amp import GradScaler, MixedPrecision, ScalerStateError
from clorch.nn.parallel import DistributedDataParallel
from clorch.precision import PRECISIONS
from clorch.strategies import adopt
from tests.harness import run_ranks
from tests.nn import models as m

pytestmark = pytest.mark.timeout(120)


def _model_and_opt(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2)).to(dtype)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _batch(seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(6, 5, generator=gen, dtype=dtype), torch.randn(6, 2, generator=gen, dtype=dtype)


def _loss(model, seed):
    x, y = _batch(seed)
    return torch.nn.functional.mse_loss(model(x).float(), y)


def _autocast_state():
    return torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")


# -- autocast and backward per mode --------------------------------------------------------------


def test_fp32_is_a_pass_through():
    precision = MixedPrecision("fp32", "cpu")
    assert precision.name == "fp32" and precision.autocast_dtype is None and precision.scaler is None
    assert precision.scale is None and precision.skipped_steps == 0 and precision.state_dict() == {}
    before = _autocast_state()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # an outer autocast is switched off inside
        with precision.autocast():
            assert not torch.is_autocast_enabled("cpu")
            assert (torch.randn(3, 4) @ torch.randn(4, 2)).dtype == torch.float32
    assert _autocast_state() == before
    model, opt = _model_and_opt()
    plain, plain_opt = _model_and_opt()
    with precision.autocast():
        precision.backward(_loss(model, 1))
    _loss(plain, 1).backward()
    for p, q in zip(model.parameters(), plain.parameters()):
        assert torch.equal(p.grad, q.grad)
    assert precision.optimizer_step(opt) is True
    plain_opt.step()
    for p, q in zip(model.parameters(), plain.parameters()):
        assert torch.equal(p, q)


def test_bf16_runs_the_forward_in_bf16_on_the_cpu_and_restores_the_state():
    precision = MixedPrecision("bfloat16", torch.device("cpu"))  # an alias names the same mode
    assert precision.mode is PRECISIONS["bf16"] and precision.autocast_dtype == torch.bfloat16
    assert precision.scaler is None and precision.scale is None
    before = _autocast_state()
    with precision.autocast():
        assert _autocast_state() == (True, torch.bfloat16)
        assert torch.nn.Linear(4, 2)(torch.randn(3, 4)).dtype == torch.bfloat16
    assert _autocast_state() == before
    model, opt = _model_and_opt()
    with precision.autocast():
        loss = _loss(model, 2)
    precision.backward(loss)  # unscaled: the gradients are the loss's own
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())
    assert precision.optimizer_step(opt) is True


def test_fp16_autocast_and_scaled_backward():
    precision = MixedPrecision("fp16", "cpu", scaler={"init_scale": 256.0})
    assert precision.scaler.device == "cpu" and precision.scale == 256.0
    with precision.autocast():
        assert _autocast_state() == (True, torch.float16)
    model, _ = _model_and_opt()
    plain, _ = _model_and_opt()
    precision.backward(_loss(model, 3))  # no autocast here: only the scaling differs from plain
    _loss(plain, 3).backward()
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, 256.0 * q.grad)


def test_fp16_steps_match_torch_grad_scaler_math():
    """Random batches, overflow injected at some steps: stepped, weights, scale and tracker are
    torch.amp.GradScaler's, step by step, with the forward under each one's fp16 autocast."""
    settings = {"init_scale": 2.0**12, "growth_factor": 4.0, "backoff_factor": 0.25, "growth_interval": 3}
    precision = MixedPrecision("fp16", "cpu", scaler=settings)
    reference = torch.amp.GradScaler("cpu", **settings)
    model, opt = _model_and_opt(seed=5)
    plain, plain_opt = _model_and_opt(seed=5)
    overflow = {2: float("inf"), 6: float("nan"), 7: float("inf")}
    outcomes = []
    for step in range(12):
        with precision.autocast():
            loss = _loss(model, 100 + step)
        precision.backward(loss)
        with torch.autocast("cpu", dtype=torch.float16):
            plain_loss = _loss(plain, 100 + step)
        reference.scale(plain_loss).backward()
        if step in overflow:
            model[0].weight.grad[1, 2] = overflow[step]
            plain[0].weight.grad[1, 2] = overflow[step]
        before = [p.detach().clone() for p in plain.parameters()]
        stepped = precision.optimizer_step(opt)
        reference.step(plain_opt)
        reference.update()
        plain_stepped = not all(torch.equal(p, b) for p, b in zip(plain.parameters(), before))
        opt.zero_grad()
        plain_opt.zero_grad()
        assert stepped is plain_stepped, step
        for p, q in zip(model.parameters(), plain.parameters()):
            torch.testing.assert_close(p, q, rtol=0, atol=0, msg=f"step {step}")
        assert precision.scale == reference.get_scale(), step
        assert precision.state_dict()["_growth_tracker"] == reference.state_dict()["_growth_tracker"], step
        outcomes.append(stepped)
    assert outcomes == [step not in overflow for step in range(12)]
    assert precision.skipped_steps == 3


def test_unscale_gradients_before_clipping_then_step():
    precision = MixedPrecision("fp16", "cpu", scaler={"init_scale": 64.0})
    model, opt = _model_and_opt()
    plain, plain_opt = _model_and_opt()
    precision.backward(_loss(model, 4))
    precision.unscale_gradients(opt)
    _loss(plain, 4).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    torch.nn.utils.clip_grad_norm_(plain.parameters(), 0.1)
    assert precision.optimizer_step(opt) is True  # does not unscale a second time
    plain_opt.step()
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q)
    opt.zero_grad()
    precision.backward(_loss(model, 5))
    precision.unscale_gradients(opt)
    with pytest.raises(ScalerStateError, match=r"unscale_\(\) has already been called"):
        precision.unscale_gradients(opt)
    MixedPrecision("bf16", "cpu").unscale_gradients(opt)  # nothing to unscale without a scaler


# -- the step through a model, state, readouts ----------------------------------------------------


def _strategy(model, opt, precision):
    """The `DDPStrategy` that steps `model` through `precision` (clorch's one step path)."""
    raw = getattr(model, "module", model)
    return adopt(model, raw, opt, precision, torch.device("cpu"))


def test_optimizer_step_through_a_ddp_model_zeroes_the_gradients():
    precision = MixedPrecision("fp16", "cpu", scaler={"init_scale": 32.0})
    with DistributedDataParallel(m.mlp()) as ddp:
        opt = m.make_optimizer(ddp.module)
        x, y = m.batches(1, 4, seed=3)[0]
        precision.backward(m.loss_fn(ddp(x), y))
        assert _strategy(ddp, opt, precision).optimizer_step() is True
        assert all(p.grad is None for p in ddp.parameters())
        # Twice through the same precision object, and through another mode's.
        precision.backward(m.loss_fn(ddp(x), y))
        assert _strategy(ddp, opt, precision).optimizer_step() is True
        bf16 = MixedPrecision("bf16", "cpu")
        bf16.backward(m.loss_fn(ddp(x), y))
        assert _strategy(ddp, opt, bf16).optimizer_step() is True
    with pytest.raises(TypeError, match="model must be None or a clorch DistributedDataParallel"):
        _strategy(torch.nn.Linear(2, 2), opt, precision).optimizer_step()
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer, got str"):
        MixedPrecision("fp32", "cpu").optimizer_step("sgd")


def test_state_dict_is_the_scalers_and_round_trips():
    precision = MixedPrecision("fp16", "cpu", scaler={"init_scale": 512.0, "growth_interval": 5})
    model, opt = _model_and_opt()
    for seed in range(3):
        precision.backward(_loss(model, seed))
        if seed == 1:
            model[0].weight.grad.fill_(float("inf"))
        precision.optimizer_step(opt)
        opt.zero_grad()
    state = precision.state_dict()
    assert (
        state
        == precision.scaler.state_dict()
        == {
            "scale": 256.0,
            "growth_factor": 2.0,
            "backoff_factor": 0.5,
            "growth_interval": 5,
            "_growth_tracker": 1,
            "skipped_steps": 1,
        }
    )
    assert precision.scale == 256.0 and precision.skipped_steps == 1
    fresh = MixedPrecision("fp16", "cpu")
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state
    alone = GradScaler("cpu")  # a scaler's own state dict and the precision's are one format
    alone.load_state_dict(fresh.state_dict())
    assert alone.state_dict() == state
    MixedPrecision("bf16", "cpu").load_state_dict(state)  # nothing to restore: ignored
    with pytest.raises(TypeError, match="state must be a dict"):
        fresh.load_state_dict([("scale", 1.0)])
    with pytest.raises(ValueError, match="state dict is empty"):
        fresh.load_state_dict({})


def test_scaler_argument_forms():
    given = GradScaler("cpu", init_scale=8.0)
    assert MixedPrecision("fp16", "cpu", scaler=given).scaler is given
    assert MixedPrecision("fp16", "cpu", scaler=True).scale == GradScaler("cpu").get_scale()
    assert MixedPrecision("fp16", "cpu", scaler=False).scaler is None
    assert MixedPrecision("bf16", "cpu", scaler=False).scaler is None
    defaults = MixedPrecision("fp16", "cpu").scaler  # GradScaler's own defaults, nothing restated
    assert (defaults.get_scale(), defaults.growth_factor, defaults.backoff_factor, defaults.growth_interval) == (
        65536.0,
        2.0,
        0.5,
        2000,
    )
    assert "fp16" in repr(MixedPrecision("fp16", "cpu"))


@pytest.mark.parametrize(
    "call, error, text",
    [
        (lambda: MixedPrecision("fp8", "cpu"), ValueError, "precision must be one of"),
        (lambda: MixedPrecision(torch.float16, "cpu"), TypeError, "precision must be a str"),
        (lambda: MixedPrecision("fp16", "tpu"), ValueError, "device must be 'cuda', 'cuda:N' or 'cpu'"),
        (
            lambda: MixedPrecision("bf16", "cpu", scaler=GradScaler("cpu")),
            ValueError,
            "scaler is for precision fp16 only (bf16 needs no loss scaling)",
        ),
        (lambda: MixedPrecision("fp32", "cpu", scaler={"init_scale": 2.0}), ValueError, "fp16 only"),
        (
            lambda: MixedPrecision("fp16", "cpu", scaler=torch.amp.GradScaler("cpu")),
            TypeError,
            "scaler must be None, a bool, a clorch.amp.GradScaler or a mapping",
        ),
        (lambda: MixedPrecision("fp16", "cpu", scaler={"device": "cpu"}), TypeError, "must not name 'device'"),
        (
            lambda: MixedPrecision("fp16", "cpu", scaler={"init_scale": 0.0}),
            ValueError,
            "init_scale must be a finite number > 0",
        ),
        (lambda: MixedPrecision("fp16", "cpu", scaler={"scale": 2.0}), TypeError, "unexpected keyword"),
        (
            lambda: MixedPrecision("fp16", "cuda", scaler=GradScaler("cpu")),
            ValueError,
            "scaler was made for device 'cpu', but this precision runs on 'cuda'",
        ),
        (lambda: MixedPrecision("fp32", "cpu").backward(1.0), TypeError, "loss must be a torch.Tensor"),
    ],
)
def test_errors(call, error, text):
    with pytest.raises(error) as info:
        call()
    assert text in str(info.value)


# -- GradScaler.unscale_flat_ --------------------------------------------------------------------


def _flat_params(scale, seed=0):
    """Parameters whose gradients are views of one flat buffer (as DDP's buckets), scaled by `scale`."""
    gen = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(shape, generator=gen)) for shape in ((4, 3), (3,), (2, 4))]
    flat = torch.randn(sum(p.numel() for p in params), generator=gen) * scale
    offset = 0
    for p in params:
        p.grad = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    return params, flat


def test_unscale_flat_equals_unscale_and_step_does_not_unscale_again():
    params, flat = _flat_params(16.0)
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for twin, p in zip(twins, params):
        twin.grad = p.grad.clone()
    opt, twin_opt = torch.optim.SGD(params, lr=0.5), torch.optim.SGD(twins, lr=0.5)
    scaler, twin_scaler = GradScaler("cpu", init_scale=16.0), GradScaler("cpu", init_scale=16.0)
    scaler.scale(torch.ones(()))  # places the scale, as a scaled backward does
    twin_scaler.scale(torch.ones(()))
    assert not scaler.is_unscaled(opt)
    scaler.unscale_flat_(opt, [flat])
    twin_scaler.unscale_(twin_opt)
    assert scaler.is_unscaled(opt)
    for p, twin in zip(params, twins):
        assert torch.equal(p.grad, twin.grad)
    with pytest.raises(
        ScalerStateError,
        match=r"unscale_flat_\(\): this optimizer's gradients were "
        r"already unscaled",
    ):
        scaler.unscale_flat_(opt, [flat])
    with pytest.raises(ScalerStateError, match=r"unscale_\(\) has already been called"):
        scaler.unscale_(opt)
    assert scaler.step(opt) is True and twin_scaler.step(twin_opt) is True
    for p, twin in zip(params, twins):
        assert torch.equal(p, twin)  # step() did not divide the gradients a second time
    with pytest.raises(ScalerStateError, match=r"unscale_flat_\(\) is being called after step\(\)"):
        scaler.unscale_flat_(opt, [flat])
    scaler.update()
    assert not scaler.is_unscaled(opt) and scaler.get_scale() == 16.0


def test_unscale_flat_records_overflow_for_step():
    params, flat = _flat_params(4.0)
    opt = torch.optim.SGD(params, lr=0.5)
    scaler = GradScaler("cpu", init_scale=4.0)
    scaler.scale(torch.ones(()))
    flat[5] = float("inf")
    before = [p.detach().clone() for p in params]
    scaler.unscale_flat_(opt, (flat,))
    assert scaler.step(opt) is False
    scaler.update()
    assert all(torch.equal(p, b) for p, b in zip(params, before)) and scaler.get_scale() == 2.0


def test_unscale_flat_arguments_and_disabled_scaler():
    params, flat = _flat_params(2.0)
    opt = torch.optim.SGD(params, lr=0.5)
    with pytest.raises(TypeError, match="flats must be a list or tuple of floating tensors"):
        GradScaler("cpu").unscale_flat_(opt, flat)
    with pytest.raises(TypeError, match="flats must be a list or tuple of floating tensors"):
        GradScaler("cpu").unscale_flat_(opt, [torch.zeros(3, dtype=torch.int64)])
    disabled = GradScaler("cpu", enabled=False)
    kept = flat.clone()
    disabled.unscale_flat_(opt, [flat])
    assert torch.equal(flat, kept) and not disabled.is_unscaled(opt)


# -- through DDP on gloo ranks -------------------------------------------------------------------


def _ddp_with_precision(rank, world_size, through):
    """The engine's path (DDPStrategy.optimizer_step through MixedPrecision) == the GradScaler
    driven by hand over DDP's buckets (unscale_flat_, step, update), step by step, an overflow on
    one rank skipped everywhere; records whether the flat-bucket unscale ran."""
    data = m.batches(4, 2 * world_size, seed=23)
    precision = MixedPrecision("fp16", "cpu", scaler={"init_scale": 2.0**10})
    flat_calls = []
    unscale_flat = precision.scaler.unscale_flat_
    precision.scaler.unscale_flat_ = lambda opt, flats: (flat_calls.append(len(flats)), unscale_flat(opt, flats))
    results = []
    with DistributedDataParallel(m.mlp(), first_bucket_cap_mb=1e-4) as ddp:
        opt = m.make_optimizer(ddp.module)
        strategy = adopt(ddp, ddp.module, opt, precision, torch.device("cpu"), rank, world_size)
        for step, batch in enumerate(data):
            x, y = m.shard(batch, rank, world_size)
            if step == 1 and rank == 0:
                x = x.clone()
                x[0, 0] = float("inf")
            with precision.autocast():
                loss = m.loss_fn(ddp(x), y)
            precision.backward(loss)
            if through == "precision":
                results.append(strategy.optimizer_step())
            else:
                scaler = precision.scaler
                scaler.unscale_flat_(opt, [bucket.flat for bucket in ddp.buckets])
                results.append(scaler.step(opt))
                scaler.update()
                opt.zero_grad(set_to_none=True)
        weights = m.weights(ddp.module)
    return results, precision.state_dict(), weights, len(flat_calls), len(ddp.buckets)


def _both_paths(rank, world_size):
    return _ddp_with_precision(rank, world_size, "precision"), _ddp_with_precision(rank, world_size, "scaler")


@pytest.mark.parametrize("world_size", [2])
def test_precision_through_ddp_matches_the_scaler_through_ddp(world_size):
    for mine, theirs in run_ranks(_both_paths, world_size, timeout=100):
        stepped, state, weights, flat_calls, _ = mine
        assert stepped == theirs[0] == [True, False, True, True]
        assert state == theirs[1] and state["skipped_steps"] == 1 and state["scale"] == 512.0
        for key, value in weights.items():
            torch.testing.assert_close(value, theirs[2][key], rtol=0, atol=0, msg=key)
        assert flat_calls == theirs[3] == 4  # every step unscaled the buckets, not each gradient
