"""`model.liger=true`: Liger-Kernel's fused Triton kernels in a Hugging Face model.

Liger-Kernel (`pip install 'clorch[liger]'`, CUDA only) replaces a Hugging Face model's RMSNorm,
rotary embedding, SwiGLU/GeGLU MLP and, when the model computes its own loss
(`loss=from_model`), its output layer and cross-entropy (`LigerFusedLinearCrossEntropy`: no
logits tensor while training) with fused kernels, in place. The parameters and their names
are untouched, so checkpoints and exports are the plain model's.

With `compile=true` the model is compiled as usual, except Liger's fused linear cross-entropy:
it chunks on the host (a Python loop sized by `.item()`) around its own Triton kernels, which
torch.compile cannot trace (torch 2.11 fails on its `addmm(out_dtype=...)`), so clorch marks it
as a call the compiler leaves alone. The compiled graph ends at the hidden states and Liger's
loss runs as Liger wrote it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["LIGER_ARCHITECTURES", "apply_liger"]

LIGER_ARCHITECTURES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi3",
    "granite",
    "olmo2",
)
"""Hugging Face `config.model_type`s clorch applies Liger-Kernel to (`apply_liger_kernel_to_<type>`)."""


def architecture(model: nn.Module) -> str | None:
    """The Hugging Face `config.model_type` of `model`, or None for a model without one."""
    return getattr(getattr(model, "config", None), "model_type", None)


def unsupported(model: nn.Module) -> str | None:
    """Why Liger-Kernel cannot patch `model` (a message naming the supported ones), or None."""
    kind = architecture(model)
    if kind in LIGER_ARCHITECTURES:
        return None
    what = (
        f"a {type(model).__name__} (model_type {kind!r})"
        if kind
        else f"a {type(model).__name__}, no Hugging Face model"
    )
    return (
        f"model.liger=true supports Hugging Face models of type {', '.join(LIGER_ARCHITECTURES)}; "
        f"the model is {what} (drop model.liger)"
    )


def apply_liger(model: nn.Module) -> nn.Module:
    """Patch `model` in place with Liger-Kernel's kernels for its architecture; returns it.

    Raises:
        ValueError: an architecture Liger-Kernel (through clorch) does not support.
        ImportError: liger-kernel is not installed.
    """
    problem = unsupported(model)
    if problem:
        raise ValueError(problem)
    try:  # liger-kernel is an optional extra
        import liger_kernel.transformers as liger
        from liger_kernel.ops import LigerFusedLinearCrossEntropyFunction
    except ImportError as exc:
        raise ImportError(f"model.liger=true needs liger-kernel: pip install 'clorch[liger]' ({exc})") from exc
    patch: Any = getattr(liger, f"apply_liger_kernel_to_{architecture(model)}")
    patch(model=model)
    _keep_fused_loss_out_of_compile(LigerFusedLinearCrossEntropyFunction)
    return model


def _keep_fused_loss_out_of_compile(fused: Any) -> None:
    """Make torch.compile run Liger's fused linear cross-entropy (the autograd Function `fused`)
    uncompiled (module docstring).

    Patches the Function's `apply` once per process; it changes nothing when nothing is compiled."""
    if not getattr(fused, "_clorch_uncompiled", False):
        fused.apply = torch.compiler.disable(fused.apply)
        fused._clorch_uncompiled = True
