"""LR schedules: the curve step by step, resume through state_dict, argument errors."""

from __future__ import annotations

import math

import pytest
import torch

from clorch.config.schema import CosineScheduleConfig
from clorch.optim import build_scheduler
from clorch.optim.schedule import COSINE_MIN_LR_RATIO, COSINE_WARMUP_STEPS

pytestmark = pytest.mark.timeout(60)


def _optimizer(lr=0.3):
    return torch.optim.SGD([torch.nn.Parameter(torch.randn(3))], lr=lr)


def _lrs(scheduler, steps):
    out = []
    for _ in range(steps):
        out.append(scheduler.optimizer.param_groups[0]["lr"])
        scheduler.optimizer.step()
        scheduler.step()
    return out


def test_cosine_with_warmup_follows_the_formula():
    warmup, total, floor, base = 3, 11, 0.1, 0.3
    lrs = _lrs(
        build_scheduler(_optimizer(base), "cosine", warmup_steps=warmup, total_steps=total, min_lr_ratio=floor), 15
    )
    for step, lr in enumerate(lrs):
        if step < warmup:
            want = base * (step + 1) / warmup
        else:
            progress = min(1.0, (step - warmup) / (total - warmup))
            want = base * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))
        assert lr == pytest.approx(want, rel=1e-12), step
    assert lrs[warmup - 1] == pytest.approx(base) and lrs[total:] == [pytest.approx(base * floor)] * 4


def test_constant_with_and_without_warmup():
    assert _lrs(build_scheduler(_optimizer(0.3), "constant"), 4) == [pytest.approx(0.3)] * 4
    lrs = _lrs(build_scheduler(_optimizer(0.3), "constant", warmup_steps=4), 6)
    assert lrs == pytest.approx([0.075, 0.15, 0.225, 0.3, 0.3, 0.3])


def test_a_resumed_scheduler_continues_the_same_curve():
    first = build_scheduler(_optimizer(), "cosine", warmup_steps=2, total_steps=20, min_lr_ratio=0.05)
    head = _lrs(first, 7)
    state = first.state_dict()
    resumed = build_scheduler(_optimizer(), "cosine", warmup_steps=2, total_steps=20, min_lr_ratio=0.05)
    resumed.load_state_dict(state)
    # A fresh scheduler has set lr to its step-0 value; the loaded one resumes from step 7.
    resumed.optimizer.param_groups[0]["lr"] = resumed.get_last_lr()[0]
    reference = build_scheduler(_optimizer(), "cosine", warmup_steps=2, total_steps=20, min_lr_ratio=0.05)
    whole = _lrs(reference, 12)
    assert head + _lrs(resumed, 5) == whole
    assert state["lr_lambdas"] == [{"warmup_steps": 2, "total_steps": 20, "min_lr_ratio": 0.05}]


def test_constant_warns_about_ignored_settings():
    with pytest.warns(UserWarning, match="schedule 'constant' ignores total_steps and min_lr_ratio"):
        build_scheduler(_optimizer(), "constant", total_steps=10)


@pytest.mark.parametrize(
    "name, kwargs, text",
    [
        ("linear", {}, "schedule name must be one of constant, cosine, got 'linear'"),
        ("cosine", {}, "schedule.total_steps is required by 'cosine' (an int > warmup_steps), got None"),
        (
            "cosine",
            {"warmup_steps": 10, "total_steps": 10},
            "schedule.total_steps must be > warmup_steps (10) for 'cosine', got 10",
        ),
        ("cosine", {"total_steps": 0}, "schedule.total_steps must be an int >= 1, got 0"),
        ("constant", {"warmup_steps": -1}, "schedule.warmup_steps must be an int >= 0, got -1"),
        ("constant", {"warmup_steps": 2.5}, "schedule.warmup_steps must be an int >= 0, got 2.5"),
        (
            "cosine",
            {"total_steps": 5, "min_lr_ratio": 1.5},
            "schedule.min_lr_ratio must be a number in [0, 1], got 1.5",
        ),
    ],
)
def test_bad_arguments_are_named(name, kwargs, text):
    with pytest.raises(ValueError) as info:
        build_scheduler(_optimizer(), name, **kwargs)
    assert text in str(info.value)


def test_needs_an_optimizer():
    with pytest.raises(TypeError, match="build_scheduler needs a torch.optim.Optimizer, got list"):
        build_scheduler([], "constant")


def test_the_cosine_defaults_of_the_library_are_the_configs():
    config = CosineScheduleConfig()
    assert (config.warmup_steps, config.min_lr_ratio) == (COSINE_WARMUP_STEPS, COSINE_MIN_LR_RATIO)
    defaults = _lrs(build_scheduler(_optimizer(1.0), "cosine", total_steps=40), 40)
    explicit = _lrs(
        build_scheduler(
            _optimizer(1.0),
            "cosine",
            total_steps=40,
            warmup_steps=config.warmup_steps,
            min_lr_ratio=config.min_lr_ratio,
        ),
        40,
    )
    assert defaults == explicit
