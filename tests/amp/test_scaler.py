"""GradScaler in one process: unscale, skip on inf/nan, backoff, growth, state, errors."""

from __future__ import annotations

import pytest
import torch

from clorch import amp
from clorch.amp import GradScaler

pytestmark = pytest.mark.timeout(30)


def _model_and_opt(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _backward(model, scaler, seed=1):
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(6, 5, generator=gen), torch.randn(6, 2, generator=gen)
    amp.backward(scaler, torch.nn.functional.mse_loss(model(x), y))


def test_scaled_step_equals_plain_step():
    model, opt = _model_and_opt()
    plain, plain_opt = _model_and_opt()
    scaler = GradScaler("cpu", init_scale=1024.0)
    _backward(model, scaler)
    scaler.unscale_(opt)  # e.g. before clipping: grads are the true gradients now
    _backward(plain, None)
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert amp.step(scaler, opt) is True and amp.step(None, plain_opt) is True
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q)
    assert scaler.get_scale() == 1024.0 and scaler.skipped_steps == 0 and not scaler.last_step_skipped


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_overflow_skips_and_backs_off(bad):
    model, opt = _model_and_opt()
    scaler = GradScaler("cpu", init_scale=256.0, backoff_factor=0.25)
    _backward(model, scaler)
    next(model.parameters()).grad[0, 0] = bad
    before = [p.detach().clone() for p in model.parameters()]
    assert scaler.step(opt) is False
    scaler.update()  # backoff happens here, as with torch
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert scaler.get_scale() == 64.0 and scaler.skipped_steps == 1 and scaler.last_step_skipped


def test_growth_after_interval_clean_steps():
    model, opt = _model_and_opt()
    scaler = GradScaler("cpu", init_scale=8.0, growth_factor=3.0, growth_interval=3)
    scales = []
    for step in range(7):
        _backward(model, scaler, seed=step)
        assert scaler.step(opt) is True
        scaler.update()
        opt.zero_grad()
        scales.append(scaler.get_scale())
    assert scales == [8.0, 8.0, 24.0, 24.0, 24.0, 72.0, 72.0]


def test_second_unscale_is_an_error():
    model, opt = _model_and_opt()
    scaler = GradScaler("cpu")
    _backward(model, scaler)
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match=r"unscale_\(\) has already been called on this optimizer"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match=r"unscale_\(\) is being called after step\(\)"):
        scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match=r"step\(\) has already been called since the last update\(\)"):
        scaler.step(opt)
    scaler.update()
    with pytest.raises(RuntimeError, match=r"update\(\) was called without a step"):
        scaler.update()
    _backward(model, scaler)
    scaler.unscale_(opt)  # allowed again after update


def test_state_dict_round_trip():
    model, opt = _model_and_opt()
    scaler = GradScaler("cpu", init_scale=512.0, growth_interval=5)
    for seed in range(3):
        _backward(model, scaler, seed)
        if seed == 1:
            next(model.parameters()).grad.fill_(float("inf"))
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    state = scaler.state_dict()
    assert state == {
        "scale": 256.0,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 5,
        "_growth_tracker": 1,
        "skipped_steps": 1,
    }
    fresh = GradScaler("cpu")
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state and fresh.get_scale() == 256.0
    loss = torch.tensor(3.0)
    assert fresh.scale(loss).item() == 768.0
    with pytest.raises(ValueError, match=r"state is missing key\(s\) \['_growth_tracker'\]"):
        fresh.load_state_dict({k: v for k, v in state.items() if k != "_growth_tracker"})
    with pytest.raises(ValueError, match=r"backoff_factor must be in \(0, 1\), got 2"):
        fresh.load_state_dict({**state, "backoff_factor": 2})


@pytest.mark.parametrize(
    "kwargs, text",
    [
        ({"initial_scale": 0.0}, "init_scale must be a finite number > 0, got 0.0"),
        ({"init_scale": -1.0}, "init_scale must be a finite number > 0, got -1.0"),
        ({"device": "tpu"}, "device must be 'cuda' or 'cpu' (or a torch.device), got 'tpu'"),
        ({"growth_factor": 1.0}, "growth_factor must be > 1, got 1.0"),
        ({"backoff_factor": 1.0}, "backoff_factor must be in (0, 1), got 1.0"),
        ({"backoff_factor": 0}, "backoff_factor must be a finite number > 0, got 0"),
        ({"growth_interval": 0}, "growth_interval must be an int >= 1 (steps), got 0"),
    ],
)
def test_invalid_settings(kwargs, text):
    with pytest.raises(ValueError) as info:
        GradScaler(**{"device": "cpu", **kwargs})
    assert text in str(info.value)


def test_disabled_is_a_pass_through():
    model, opt = _model_and_opt()
    scaler = GradScaler("cpu", enabled=False)
    loss = torch.tensor(2.5)
    assert scaler.scale(loss) is loss and scaler.get_scale() == 1.0
    _backward(model, scaler)
    next(model.parameters()).grad[0, 0] = float("inf")
    assert scaler.step(opt) is True


def _fp16_like_run(scaler, overflow_at):
    """Fused AdamW on the CPU with a scaler; the loss is inf at `overflow_at` (a step to skip)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    gen = torch.Generator().manual_seed(1)
    stepped = []
    for index in range(6):
        x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 2, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), y)
        if index == overflow_at:
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        stepped.append(scaler.step(opt))
        scaler.update()
        opt.zero_grad(set_to_none=True)
    return model, opt, stepped


def test_a_fused_optimizer_skips_on_the_device_as_torch_gradscaler_does():
    ours = GradScaler("cpu", init_scale=1024.0, growth_interval=2)
    model, opt, stepped = _fp16_like_run(ours, overflow_at=2)
    theirs = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)
    ref, ref_opt, _ = _fp16_like_run(theirs, overflow_at=2)
    # The decision stayed a tensor (nothing read on the host) and says what happened.
    assert all(isinstance(s, torch.Tensor) for s in stepped)
    assert [bool(s) for s in stepped] == [True, True, False, True, True, True]
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters()))
    assert torch.equal(opt.state_dict()["state"][0]["step"], ref_opt.state_dict()["state"][0]["step"])
    # The host's view catches up when read: scale, skipped steps, growth tracker.
    # 1024: grows after steps 0-1, halves at the skip (2), grows after 3-4: 2048.
    assert ours.get_scale() == theirs.get_scale() == 2048.0
    assert ours.skipped_steps == 1 and ours.last_step_skipped is False
    assert ours.state_dict()["_growth_tracker"] == theirs._get_growth_tracker()


def test_fused_sgd_keeps_the_host_decision_so_a_skipped_first_step_leaves_no_state():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
    scaler = GradScaler("cpu", init_scale=8.0)
    (model(torch.randn(3, 4)).sum() * float("inf")).backward()
    assert scaler.step(opt) is False  # a bool: decided on the host
    scaler.update()
    assert not opt.state  # no momentum buffer was made for the skipped step


def test_loading_a_state_after_device_decided_steps_resets_the_device_scale():
    scaler = GradScaler("cpu", init_scale=1024.0)
    saved = scaler.state_dict()
    _fp16_like_run(scaler, overflow_at=0)  # backs off on the device without a host read
    scaler.load_state_dict(saved)
    assert scaler.get_scale() == 1024.0
    assert scaler._scale.item() == 1024.0 and scaler._inv_scale.item() == 1 / 1024.0
