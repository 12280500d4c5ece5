"""The total gradient norm, and clipping to it, for a strategy's `clip_gradients`.

The numerics are `torch.nn.utils.clip_grad_norm_(parameters, max_norm)`: the
norm is taken over the (averaged, unscaled) gradients in the parameters'
order, so on identical gradients it is the same on every rank, and every
rank clips alike. Unscaling is the precision object's job
(`clorch.amp.MixedPrecision.unscale_gradients`), called by the strategy
before this; nothing here touches a loss scaler.
"""

from __future__ import annotations

from typing import Any

import torch


def norm_and_clip(parameters: Any, max_norm: float | None) -> torch.Tensor | None:
    """The total 2-norm of the (unscaled) gradients of `parameters`, clipped to `max_norm` when
    given; None when no parameter has a gradient. Local: no collective and no host sync (the norm
    stays on the device). A step whose gradients overflowed has an inf or nan norm; clipping makes
    its gradients nan too, and a loss scaler skips it as it would anyway."""
    params = [p for p in parameters if p.grad is not None]
    if not params:
        return None
    total = torch.nn.utils.get_total_norm([p.grad for p in params], 2.0)
    if max_norm is not None:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total
