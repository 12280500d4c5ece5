"""Learning-rate schedules: constant or cosine, each with an optional linear warmup.

Both are `LambdaLR` multipliers of the optimizer's base lr, stepped once per optimizer
step. The multiplier is a small callable object holding only numbers, so
`scheduler.state_dict()` captures it and a resumed run continues the same curve.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
from torch.optim.lr_scheduler import LambdaLR

SCHEDULES = ("constant", "cosine")
# The cosine schedule's defaults, here and in the config (schedule=cosine reads these two).
COSINE_WARMUP_STEPS = 10
COSINE_MIN_LR_RATIO = 0.1


@dataclass
class WarmupCosine:
    """lr multiplier at step s: linear warmup to 1, then a cosine down to `min_lr_ratio`.

    Warmup gives `(s + 1) / warmup_steps` for `s < warmup_steps`, so the first step already
    trains. With `total_steps=None` the multiplier stays 1 after warmup (constant).
    After `total_steps` it stays at `min_lr_ratio`.
    """

    warmup_steps: int = 0
    total_steps: int | None = None
    min_lr_ratio: float = 0.0

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.total_steps is None:
            return 1.0
        progress = min(1.0, (step - self.warmup_steps) / (self.total_steps - self.warmup_steps))
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"schedule.{name} must be an int >= {minimum}, got {value!r}")


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    name: str,
    *,
    warmup_steps: int | None = None,
    total_steps: int | None = None,
    min_lr_ratio: float | None = None,
) -> LambdaLR:
    """A `LambdaLR` for `optimizer`; call `scheduler.step()` after each `optimizer.step()`.

    Args:
        optimizer: the optimizer whose groups' lr the schedule scales.
        name: "constant" (after warmup) or "cosine" (warmup, then cosine decay).
        warmup_steps: steps of linear warmup, >= 0; None: 0 for "constant",
            COSINE_WARMUP_STEPS (10) for "cosine", as in the config.
        total_steps: cosine only: the step at which the lr reaches `min_lr_ratio * lr`;
            must be > warmup_steps. Ignored (with a warning) by "constant".
        min_lr_ratio: cosine only: the final lr as a fraction of the base lr, in [0, 1];
            None: COSINE_MIN_LR_RATIO (0.1), as in the config.

    Raises:
        ValueError: unknown name, or an argument outside its range.
        TypeError: `optimizer` is not a torch optimizer.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"build_scheduler needs a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if name not in SCHEDULES:
        raise ValueError(f"schedule name must be one of {', '.join(SCHEDULES)}, got {name!r}")
    if name == "constant":
        if total_steps is not None or min_lr_ratio is not None:
            warnings.warn("schedule 'constant' ignores total_steps and min_lr_ratio", stacklevel=2)
        warmup_steps = 0 if warmup_steps is None else warmup_steps
        _check_int("warmup_steps", warmup_steps, 0)
        return LambdaLR(optimizer, WarmupCosine(warmup_steps=warmup_steps))
    warmup_steps = COSINE_WARMUP_STEPS if warmup_steps is None else warmup_steps
    min_lr_ratio = COSINE_MIN_LR_RATIO if min_lr_ratio is None else min_lr_ratio
    _check_int("warmup_steps", warmup_steps, 0)
    if isinstance(min_lr_ratio, bool) or not isinstance(min_lr_ratio, (int, float)) or not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"schedule.min_lr_ratio must be a number in [0, 1], got {min_lr_ratio!r}")
    if total_steps is None:
        raise ValueError("schedule.total_steps is required by 'cosine' (an int > warmup_steps), got None")
    _check_int("total_steps", total_steps, 1)
    if total_steps <= warmup_steps:
        raise ValueError(
            f"schedule.total_steps must be > warmup_steps ({warmup_steps}) for 'cosine', got {total_steps}: "
            "lower schedule.warmup_steps, or run more steps"
        )
    return LambdaLR(optimizer, WarmupCosine(warmup_steps, total_steps, float(min_lr_ratio)))
