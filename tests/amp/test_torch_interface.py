"""clorch.amp speaks torch.amp's interface: GradScaler's call sequence and state, autocast's signature."""

from __future__ import annotations

import pytest
import torch

from clorch.amp import GradScaler, autocast

pytestmark = pytest.mark.timeout(60)


def _setup(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _train(scaler_cls, overflow_at=(3,), steps=8):
    """torch's documented GradScaler loop with unscale_ + clipping; returns weights and scales."""
    model, opt = _setup()
    scaler = scaler_cls("cpu", init_scale=2.0**12, growth_interval=2)
    gen = torch.Generator().manual_seed(5)
    scales = []
    for step in range(steps):
        x, y = torch.randn(6, 5, generator=gen), torch.randn(6, 2, generator=gen)
        opt.zero_grad()
        scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
        if step in overflow_at:
            model[0].weight.grad[0, 0] = float("inf")
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.3)
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return [p.detach().clone() for p in model.parameters()], scales, scaler


def test_same_weights_and_scales_as_torch_gradscaler():
    ours, our_scales, scaler = _train(GradScaler)
    theirs, their_scales, torch_scaler = _train(torch.amp.GradScaler)
    assert our_scales == their_scales
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert scaler.skipped_steps == 1
    # torch's state dict is a subset of ours, and each loads into the other.
    mine = scaler.state_dict()
    assert {k: mine[k] for k in torch_scaler.state_dict()} == torch_scaler.state_dict()
    fresh = GradScaler("cpu")
    fresh.load_state_dict(torch_scaler.state_dict())
    assert fresh.get_scale() == torch_scaler.get_scale()
    assert fresh._get_growth_tracker() == torch_scaler._get_growth_tracker()
    other = torch.amp.GradScaler("cpu")
    other.load_state_dict(mine)
    assert other.get_scale() == scaler.get_scale()


def test_getters_setters_and_update_with_new_scale():
    scaler = GradScaler("cpu", init_scale=8.0)
    assert scaler.is_enabled() and scaler.get_scale() == 8.0
    scaler.set_growth_factor(4.0)
    scaler.set_backoff_factor(0.25)
    scaler.set_growth_interval(7)
    assert (scaler.get_growth_factor(), scaler.get_backoff_factor(), scaler.get_growth_interval()) == (4.0, 0.25, 7)
    scaler.update(new_scale=32.0)
    assert scaler.get_scale() == 32.0
    scaler.update(torch.tensor([2.0]))
    assert scaler.get_scale() == 2.0
    with pytest.raises(ValueError, match="growth_factor must be > 1, got 0.5"):
        scaler.set_growth_factor(0.5)
    with pytest.raises(ValueError, match="new_scale must be a finite number > 0, got -1.0"):
        scaler.update(-1.0)
    assert scaler.scale([torch.tensor(1.0), torch.tensor(3.0)])[1].item() == 6.0


def test_two_optimizers_share_one_update():
    model, _ = _setup()
    first = torch.optim.SGD(model[0].parameters(), lr=0.1)
    second = torch.optim.SGD(model[2].parameters(), lr=0.1)
    scaler = GradScaler("cpu", init_scale=16.0)
    scaler.scale(model(torch.randn(3, 5)).sum()).backward()
    model[2].bias.grad[0] = float("nan")
    assert scaler.step(first) is True and scaler.step(second) is False
    scaler.update()
    assert scaler.get_scale() == 8.0 and scaler.skipped_steps == 1


def test_cuda_device_without_cuda_disables_with_a_warning():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.warns(UserWarning, match="without CUDA: the scaler is disabled"):
        scaler = GradScaler("cuda")
    assert not scaler.is_enabled() and scaler.state_dict() == {}


def test_autocast_takes_torchs_signature():
    layer = torch.nn.Linear(4, 4)
    with autocast("cpu"):  # dtype=None: torch's default for the device, bf16 on CPU
        assert layer(torch.randn(2, 4)).dtype == torch.bfloat16
    with autocast(device_type="cpu", dtype=torch.float32):  # float32 means full precision
        assert not torch.is_autocast_enabled("cpu")
        assert layer(torch.randn(2, 4)).dtype == torch.float32
    with autocast("cpu", dtype=torch.bfloat16, cache_enabled=None):
        assert torch.is_autocast_enabled("cpu")
    assert not torch.is_autocast_enabled("cpu")
    with pytest.raises(ValueError, match="device_type must be one of cuda, cpu, got 'tpu'"):
        autocast("tpu")
