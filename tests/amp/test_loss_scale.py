"""LossScale in one process: torch's update rule, host and device copies, and the checks of factors and state."""

from __future__ import annotations

import random

import pytest
import torch

from clorch.amp import loss_scale
from clorch.amp.loss_scale import LossScale, check_factors, checked_state, f32, positive

pytestmark = pytest.mark.timeout(30)

STATE = {
    "scale": 512.0,
    "growth_factor": 2.0,
    "backoff_factor": 0.5,
    "growth_interval": 5,
    "_growth_tracker": 1,
    "skipped_steps": 3,
}


def _overflow_pattern(seed: int, steps: int) -> list[bool]:
    rng = random.Random(seed)
    return [rng.random() < 0.3 for _ in range(steps)]


def _torch_rule(value, tracker, skipped, growth_factor, backoff_factor, growth_interval):
    """torch's rule, by hand, on float32 tensors: the reference for the host's view."""
    scale, tracker_tensor = torch.tensor(value, dtype=torch.float32), torch.tensor(tracker, dtype=torch.int32)
    torch._amp_update_scale_(
        scale, tracker_tensor, torch.tensor(float(skipped)), growth_factor, backoff_factor, growth_interval
    )
    return scale.item(), int(tracker_tensor.item())


def test_growth_after_interval_clean_steps_and_backoff_on_overflow():
    scale = LossScale(8.0, growth_factor=3.0, backoff_factor=0.25, growth_interval=3)
    seen = []
    for skipped in [False, False, False, False, True, False]:
        scale.update_on_host(skipped)
        seen.append((scale.value, scale.tracker))
    assert seen == [(8.0, 1), (8.0, 2), (24.0, 0), (24.0, 1), (6.0, 0), (6.0, 1)]
    assert scale.skipped == 1 and scale.last_skipped is False


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_host_rule_matches_torchs_kernel(seed):
    growth_factor, backoff_factor, growth_interval = 1.7, 0.37, 2
    scale = LossScale(1000.3, growth_factor, backoff_factor, growth_interval)
    value, tracker = scale.value, 0
    for skipped in _overflow_pattern(seed, 40):
        scale.update_on_host(skipped)
        value, tracker = _torch_rule(value, tracker, skipped, growth_factor, backoff_factor, growth_interval)
        assert (scale.value, scale.tracker) == (value, tracker)


def test_a_scale_that_would_overflow_float32_does_not_grow():
    scale = LossScale(3e38, growth_factor=2.0, backoff_factor=0.5, growth_interval=1)
    scale.update_on_host(False)
    assert scale.value == f32(3e38) and scale.tracker == 0


def test_device_tensors_follow_the_host_rule():
    scale = LossScale(1024.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2)
    scale.place(torch.device("cpu"))
    scale.update_on_host(True)
    assert scale.tensor.item() == 512.0 and scale.inverse.item() == 1 / 512.0


@pytest.mark.parametrize("seed", [3, 4])
def test_device_decided_steps_catch_up_to_the_host_rule(seed):
    pattern = _overflow_pattern(seed, 30)
    on_host = LossScale(777.7, growth_factor=2.5, backoff_factor=0.3, growth_interval=3)
    on_device = LossScale(777.7, growth_factor=2.5, backoff_factor=0.3, growth_interval=3)
    on_device.place(torch.device("cpu"))
    for skipped in pattern:
        on_host.update_on_host(skipped)
        on_device.update_on_device([torch.tensor(float(skipped))])
    assert len(on_device.unread) == len(pattern)  # nothing read on the host yet
    assert on_device.tensor.item() == on_host.value and on_device.tracker_tensor.item() == on_host.tracker
    on_device.catch_up()
    assert on_device.unread == []
    assert (on_device.value, on_device.tracker, on_device.skipped, on_device.last_skipped) == (
        on_host.value,
        on_host.tracker,
        on_host.skipped,
        on_host.last_skipped,
    )


def test_any_overflowed_optimizer_backs_off_the_device_scale():
    scale = LossScale(64.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=100)
    scale.place(torch.device("cpu"))
    scale.update_on_device([torch.tensor(0.0), torch.tensor(1.0), False])
    scale.catch_up()
    assert scale.value == scale.tensor.item() == 32.0 and scale.skipped == 1


def test_unread_flags_are_caught_up_every_catch_up_steps(monkeypatch):
    monkeypatch.setattr(loss_scale, "CATCH_UP_STEPS", 4)
    scale = LossScale(64.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=100)
    scale.place(torch.device("cpu"))
    for _ in range(3):
        scale.update_on_device([torch.tensor(1.0)])
    assert len(scale.unread) == 3 and scale.skipped == 0
    scale.update_on_device([torch.tensor(1.0)])
    assert scale.unread == [] and scale.skipped == 4 and scale.value == 4.0


def test_replace_takes_a_number_or_a_one_element_tensor():
    scale = LossScale(64.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=100)
    scale.place(torch.device("cpu"))
    scale.replace(torch.tensor([0.1]))
    assert scale.value == f32(0.1) and scale.tensor.item() == f32(0.1)
    with pytest.raises(ValueError, match=r"new_scale must be a number or a one-element tensor, got shape \(2,\)"):
        scale.replace(torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"new_scale must be a finite number > 0, got inf"):
        scale.replace(float("inf"))


def test_state_round_trip_resets_the_device_copy_and_drops_unread_flags():
    scale = LossScale(64.0, growth_factor=3.0, backoff_factor=0.25, growth_interval=7)
    scale.place(torch.device("cpu"))
    scale.update_on_device([torch.tensor(1.0)])  # unread, and the device scale already backed off
    scale.load_state_dict(checked_state(STATE))
    assert scale.unread == [] and scale.tensor.item() == 512.0 and scale.inverse.item() == 1 / 512.0
    assert scale.tracker_tensor.item() == 1
    assert scale.state_dict() == STATE


def test_checked_state_fills_older_and_optional_keys_without_changing_its_argument():
    older = {key: value for key, value in STATE.items() if key not in ("_growth_tracker", "skipped_steps")}
    older["growth_tracker"] = 4
    checked = checked_state(older)
    assert checked["_growth_tracker"] == 4 and checked["skipped_steps"] == 0
    assert "_growth_tracker" not in older and "skipped_steps" not in older


@pytest.mark.parametrize(
    "state, text",
    [
        ({}, "the scaler state dict is empty, possibly because it was saved from a disabled GradScaler"),
        (
            {"scale": 2.0},
            "state is missing key(s) ['growth_factor', 'backoff_factor', 'growth_interval', "
            "'_growth_tracker']; expected a GradScaler.state_dict()",
        ),
        ({**STATE, "scale": -3.5}, "state['scale'] must be a finite number > 0, got -3.5"),
        ({**STATE, "scale": True}, "state['scale'] must be a finite number > 0, got True"),
        ({**STATE, "growth_factor": 0.9}, "growth_factor must be > 1, got 0.9"),
        ({**STATE, "backoff_factor": 1.5}, "backoff_factor must be in (0, 1), got 1.5"),
        ({**STATE, "growth_interval": 2.0}, "growth_interval must be an int >= 1 (steps), got 2.0"),
        ({**STATE, "_growth_tracker": -1}, "state['_growth_tracker'] must be an int >= 0, got -1"),
        ({**STATE, "skipped_steps": True}, "state['skipped_steps'] must be an int >= 0, got True"),
    ],
)
def test_checked_state_refuses_bad_states(state, text):
    with pytest.raises(ValueError) as info:
        checked_state(state)
    assert str(info.value) == text


@pytest.mark.parametrize(
    "factors, text",
    [
        ((1.0, 0.5, 10), "growth_factor must be > 1, got 1.0"),
        (("2", 0.5, 10), "growth_factor must be a finite number > 0, got '2'"),
        ((float("nan"), 0.5, 10), "growth_factor must be a finite number > 0, got nan"),
        ((2.0, 1, 10), "backoff_factor must be in (0, 1), got 1"),
        ((2.0, 0, 10), "backoff_factor must be a finite number > 0, got 0"),
        ((2.0, 0.5, 0), "growth_interval must be an int >= 1 (steps), got 0"),
        ((2.0, 0.5, True), "growth_interval must be an int >= 1 (steps), got True"),
    ],
)
def test_check_factors_refuses_bad_factors(factors, text):
    with pytest.raises(ValueError) as info:
        check_factors(*factors)
    assert str(info.value) == text


def test_check_factors_accepts_torchs_defaults():
    check_factors(2.0, 0.5, 2000)
    check_factors(3, 0.25, 1)


def test_positive_returns_a_float_and_refuses_bools():
    assert positive("init_scale", 3) == 3.0 and isinstance(positive("init_scale", 3), float)
    with pytest.raises(ValueError, match=r"init_scale must be a finite number > 0, got False"):
        positive("init_scale", False)


def test_f32_rounds_to_the_device_scales_precision():
    value = random.Random(5).uniform(1.0, 1e6)
    assert f32(value) == torch.tensor(value, dtype=torch.float32).item()
