"""Gradient clipping by the total norm, for a model wrapped in clorch's DistributedDataParallel.

    >>> loss.backward()                                   # the all-reduced average is in .grad
    >>> norm = clip_grad_norm(model, optimizer, 1.0, scaler)
    >>> model.optimizer_step(optimizer, scaler)

The numerics are `torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)`
after `scaler.unscale_(optimizer)`, as torch's AMP recipe writes it: the norm
is taken over the averaged, unscaled gradients in the model's parameter order,
so it is the same on every rank, and every rank clips alike.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from clorch.nn.parallel.ddp import unwrap_model


def clip_grad_norm(
    model: nn.Module, optimizer: torch.optim.Optimizer, max_norm: float | None, scaler: Any = None
) -> torch.Tensor | None:
    """Unscale the step's gradients, take their total 2-norm and, with `max_norm`, clip them to it.

    Local: no collective and no host sync (the norm stays on the device). Call
    it on every rank after the synchronized backward (the gradients are then
    the same everywhere) and before the optimizer step; with a scaler, at most
    once per step (it unscales, and the step then does not again). A step
    whose gradients overflowed has an inf or nan norm; clipping makes its
    gradients nan too, and the scaler skips it as it would anyway.

    Args:
        model: a clorch DistributedDataParallel (its buckets are unscaled at
            once), or any module (`scaler.unscale_` then).
        optimizer: the optimizer about to step.
        max_norm: the largest total 2-norm the gradients keep; None: measure only.
        scaler: None, a clorch GradScaler, or a MixedPrecision (its scaler).

    Returns:
        The total norm before clipping (a 0-d float32 tensor on the gradients'
        device), or None when no parameter has a gradient. Where backward
        stepped already (`step_in_backward`) the norm is measured only.

    Raises:
        ValueError: `max_norm` with a model that steps in backward.
    """
    if getattr(model, "steps_in_backward", False):
        # Backward stepped already (no scaler can be in play): the averages are still in .grad,
        # to be measured, but too late to clip.
        if max_norm is not None:
            raise ValueError(
                f"grad_clip={max_norm} cannot clip gradients that backward already "
                "stepped (step_in_backward): clip with an ordinary step"
            )
    elif (unscale := getattr(model, "unscale_gradients", None)) is not None:
        unscale(optimizer, scaler)
    else:
        inner = getattr(scaler, "scaler", scaler)  # a MixedPrecision holds its scaler
        if inner is not None:
            inner.unscale_(optimizer)
    return norm_and_clip(unwrap_model(model).parameters(), max_norm)


def norm_and_clip(parameters: Any, max_norm: float | None) -> torch.Tensor | None:
    """The total 2-norm of the (unscaled) gradients of `parameters`, clipped to `max_norm` when
    given; None when no parameter has a gradient. Local: no collective."""
    params = [p for p in parameters if p.grad is not None]
    if not params:
        return None
    total = torch.nn.utils.get_total_norm([p.grad for p in params], 2.0)
    if max_norm is not None:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total
