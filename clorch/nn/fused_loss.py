"""Cross-entropy from a model's hidden states and its output matrix, in chunks of tokens.

A language model's last layer turns `N` hidden vectors into `N x V` logits, and the loss
reads them once: for GPT-2 small at 16 x 1024 tokens that is a 16,384 x 50,304 tensor
(1.6 GB in bf16, twice that for the float32 softmax and again for its gradient).
`linear_cross_entropy` never holds it: it walks the tokens `chunk_size` at a time, and for
each chunk computes the logits, the loss and, while training, the gradients of the hidden
states and of the output matrix (`softmax - onehot`, the cross-entropy gradient), then drops
the chunk's logits. Backward only scales the gradients kept from forward, so the output layer
costs its usual three matrix products and no recomputation.

The model protocol (`fuse_output_loss`): a model with

- `forward_hidden(input) -> hidden`: the states the output layer reads, shape `(..., d)`;
- `output_weight`: the output matrix, shape `(V, d)` (a tensor property or attribute);
- optionally `output_bias`: shape `(V,)`, or None;

and whose `forward(input)` is `hidden @ output_weight.T (+ output_bias)` trains with
`forward(input, target=...)` returning the mean loss instead of the logits. clorch's GPT has
them. Everything stays in one module call (`model(...)`), so DDP, FSDP's hooks and
torch.compile see one forward; the state dict is untouched.

Compiles with torch.compile: the chunk loop runs over the (static) token count, with no branch
on values. Numerics: the matrix products run in the autocast dtype as the plain layer's would,
the softmax and the loss in float32; the gradients are accumulated in float32.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

__all__ = ["IGNORE_INDEX", "linear_cross_entropy", "fuse_output_loss", "check_output_protocol"]

IGNORE_INDEX = -100  # targets equal to this count for nothing (torch's and Hugging Face's convention)


def _chunk_logits(hidden, weight, bias):
    """One chunk's logits in the products' dtype, read as float32 by what follows."""
    logits = hidden @ weight.t()
    return (logits if bias is None else logits + bias).float()


def _chunk_losses(logits, target, ignore_index):
    """(per-token losses, log-sum-exp, the rows that count, their clamped targets), float32."""
    keep = target != ignore_index
    safe = torch.where(keep, target, torch.zeros_like(target))
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(1, safe.unsqueeze(1)).squeeze(1)
    return torch.where(keep, lse - picked, torch.zeros_like(lse)), lse, keep, safe


def _chunk_gradient(logits, lse, keep, safe, count):
    """`(softmax - onehot) / count` of one chunk, ignored rows zeroed, float32.

    Written as one elementwise expression (the one-hot as a comparison with the column index,
    not a scatter) so that, compiled, it is a single pass over the logits that writes the
    gradient once in the products' dtype, with no float32 copy of the chunk."""
    columns = torch.arange(logits.shape[1], device=logits.device)
    onehot = (columns.unsqueeze(0) == safe.unsqueeze(1)).to(logits.dtype)
    scale = keep.to(logits.dtype) / count
    return (torch.exp(logits - lse.unsqueeze(1)) - onehot) * scale.unsqueeze(1)


def _product_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype the output layer's matrix products run in: autocast's where it is on, else the weight's."""
    device = weight.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype


class _LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of `hidden @ weight.T + bias` against `target`; gradients made in forward."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, chunk_size, ignore_index):
        count = (target != ignore_index).sum().clamp(min=1).float()
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        grad_b = None if bias is None else torch.zeros(bias.shape, dtype=torch.float32, device=bias.device)
        grad_h, total = [], torch.zeros((), dtype=torch.float32, device=hidden.device)
        dtype = _product_dtype(weight)
        low_w = weight.to(dtype)
        for start in range(0, hidden.shape[0], chunk_size):
            h, t = hidden[start : start + chunk_size], target[start : start + chunk_size]
            logits = _chunk_logits(h, weight, bias)
            losses, lse, keep, safe = _chunk_losses(logits, t, ignore_index)
            total = total + losses.sum()
            g = _chunk_gradient(logits, lse, keep, safe, count)
            # The gradient goes into the products in their dtype (autocast's, as the plain layer's
            # backward runs); the cast fuses into the pass that makes it.
            low = g.to(dtype)
            grad_h.append((low @ low_w).to(hidden.dtype))
            grad_w = grad_w + (low.t() @ h.to(dtype)).float()
            if grad_b is not None:
                grad_b = grad_b + g.sum(0)
        ctx.has_bias = bias is not None
        saved = (torch.cat(grad_h), grad_w.to(weight.dtype))
        ctx.save_for_backward(*saved, *(() if grad_b is None else (grad_b.to(bias.dtype),)))
        return total / count

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w, *grad_b = ctx.saved_tensors
        bias_grad = grad_b[0] * grad_out if ctx.has_bias else None
        return grad_h * grad_out, grad_w * grad_out, bias_grad, None, None, None


def _loss_only(hidden, weight, bias, target, chunk_size, ignore_index):
    """The same mean loss without gradients (evaluation, no_grad): no gradient work at all."""
    count = (target != ignore_index).sum().clamp(min=1).float()
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for start in range(0, hidden.shape[0], chunk_size):
        h, t = hidden[start : start + chunk_size], target[start : start + chunk_size]
        total = total + _chunk_losses(_chunk_logits(h, weight, bias), t, ignore_index)[0].sum()
    return total / count


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    chunk_size: int = 4096,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """`F.cross_entropy(F.linear(hidden, weight, bias), target, ignore_index=...)`, mean over the
    counted tokens, computed `chunk_size` tokens at a time so the logits are never whole.

    Args:
        hidden: `(..., d)` states the output layer reads (any leading shape).
        weight: `(V, d)` output matrix.
        target: class ids shaped as `hidden`'s leading dimensions.
        bias: `(V,)` or None.
        chunk_size: tokens per chunk; peak extra memory is about `chunk_size x V` float32 values.
        ignore_index: targets with this value count for nothing (nor in the mean's count).

    Returns:
        A 0-d float32 tensor (0 when every target is ignored).

    Raises:
        ValueError: chunk_size < 1, or target's shape does not match hidden's leading ones.
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an int >= 1 (tokens), got {chunk_size!r}")
    if tuple(target.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(
            f"target shape {tuple(target.shape)} must equal hidden's leading shape {tuple(hidden.shape[:-1])}"
        )
    flat_h, flat_t = hidden.reshape(-1, hidden.shape[-1]), target.reshape(-1)
    needs_grad = any(x is not None and x.requires_grad for x in (hidden, weight, bias))
    if torch.is_grad_enabled() and needs_grad:
        return _LinearCrossEntropy.apply(flat_h, weight, bias, flat_t, chunk_size, ignore_index)
    return _loss_only(flat_h, weight, bias, flat_t, chunk_size, ignore_index)


def check_output_protocol(model: nn.Module) -> None:
    """Raise TypeError naming what is missing when `model` does not follow the protocol
    (`forward_hidden`, `output_weight`, optional `output_bias`: see the module's docstring)."""
    missing = []
    if not callable(getattr(model, "forward_hidden", None)):
        missing.append("a forward_hidden(input) method returning the hidden states")
    if not isinstance(getattr(model, "output_weight", None), torch.Tensor):
        missing.append("an output_weight tensor (the output matrix, shape (vocab, d))")
    bias = getattr(model, "output_bias", None)
    if bias is not None and not isinstance(bias, torch.Tensor):
        missing.append("an output_bias that is a tensor or None")
    if missing:
        raise TypeError(
            f"loss=chunked_cross_entropy needs a model with {'; '.join(missing)}; "
            f"{type(model).__name__} has not (docs/training.md, 'A fused output layer and loss')"
        )


def _fused_forward(self: nn.Module, input: Any, target: torch.Tensor | None = None) -> Any:
    if target is None:
        return type(self).forward(self, input)
    hidden = self.forward_hidden(input)
    return linear_cross_entropy(
        hidden,
        self.output_weight,
        target,
        getattr(self, "output_bias", None),
        chunk_size=self._clorch_loss_chunk,
    )


def fuse_output_loss(model: nn.Module, chunk_size: int) -> nn.Module:
    """Give `model` (protocol: module docstring) a forward that takes `target=` and returns the
    mean loss through `linear_cross_entropy`; without `target` it returns the logits as before.

    Set on the instance (its class and state dict are unchanged), before DDP, fully_shard or
    torch.compile wrap it, so their hooks see one call. Returns the model.

    Raises:
        TypeError: the model lacks part of the protocol.
        ValueError: chunk_size < 1.
    """
    check_output_protocol(model)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"loss.chunk_size must be an int >= 1 (tokens), got {chunk_size!r}")
    model._clorch_loss_chunk = chunk_size
    model.forward = types.MethodType(_fused_forward, model)
    return model
