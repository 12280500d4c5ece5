"""Optimizers and learning-rate schedules, built by name from the config.

    >>> groups = param_groups(model, weight_decay=0.1, decay="matrices")
    >>> optimizer = build_optimizer("adamw", groups, lr=3e-4)
    >>> scheduler = build_scheduler(optimizer, "cosine", warmup_steps=100, total_steps=1000)

The defaults here are the config's (`optim=adamw`, `optim=sgd`): the config
reads them from this module's source, so the two cannot disagree.
"""

from __future__ import annotations

import warnings
from typing import Iterable

import torch

from clorch.optim.schedule import SCHEDULES, WarmupCosine, build_scheduler

__all__ = [
    "build_optimizer",
    "build_scheduler",
    "param_groups",
    "OPTIMIZERS",
    "SCHEDULES",
    "DECAY_RULES",
    "no_decay_ids",
    "ADAMW_BETAS",
    "SGD_MOMENTUM",
    "WarmupCosine",
]

OPTIMIZERS = ("adamw", "sgd")
ADAMW_BETAS = (0.9, 0.95)  # nanoGPT's and GPT-3's; torch's own default is (0.9, 0.999)
SGD_MOMENTUM = 0.9  # torch's own default is 0 (plain SGD)
DECAY_RULES = ("matrices", "all")
DEFAULT_DECAY = "matrices"


# Parameters named so are position embeddings and learned tokens, which decay would pull toward
# zero: timm's `no_weight_decay()` names (ViT, DeiT) by their last part, and any part starting
# with Hugging Face's and CLIP's `position_embedding` (`position_embeddings.weight` too).
NO_DECAY_NAMES = ("pos_embed", "cls_token", "dist_token")
NO_DECAY_PREFIXES = ("position_embedding",)
# Modules whose weights are embeddings or normalization scales, whatever their shape.
NO_DECAY_MODULES = (
    torch.nn.Embedding,
    torch.nn.EmbeddingBag,
    torch.nn.modules.batchnorm._NormBase,  # BatchNorm, SyncBatchNorm, InstanceNorm
    torch.nn.LayerNorm,
    torch.nn.GroupNorm,
    torch.nn.RMSNorm,
    torch.nn.LocalResponseNorm,
)


def param_groups(model: torch.nn.Module, weight_decay: float, decay: str = DEFAULT_DECAY) -> list[dict]:
    """The trainable parameters of `model` as optimizer param groups, by which ones decay.

    decay="matrices" (timm's and minGPT's rule; nanoGPT's but for its embeddings): the weight
    matrices and convolution kernels decay (tensors of 2 or more dimensions); these do not:
    - biases, norm weights, 1-d and 0-d parameters;
    - the weights of embeddings (`nn.Embedding`, `nn.EmbeddingBag`: a weight tied to an
      embedding, as GPT-2's output layer is, counts as the embedding) and of normalization
      modules of any shape (`no_decay_ids`);
    - position embeddings and learned tokens, by name: a last part `pos_embed`, `cls_token` or
      `dist_token` (timm's ViT and DeiT), or a part starting with `position_embedding`
      (Hugging Face's, CLIP's).
    Two groups, the decayed first. decay="all": one group, every parameter decays (torch's
    `optimizer(model.parameters(), weight_decay=...)`).

    Parameters keep `model.parameters()`'s order within a group; a tied or
    shared weight appears once. Pass the result to `build_optimizer` as `params`.

    Raises:
        ValueError: `decay` is not one of DECAY_RULES.
    """
    if decay not in DECAY_RULES:
        raise ValueError(f"optim.decay must be one of {', '.join(DECAY_RULES)}, got {decay!r}")
    params = [p for p in model.parameters() if p.requires_grad]
    if decay == "all":
        return [{"params": params, "weight_decay": weight_decay}] if params else []
    kept = no_decay_ids(model)
    groups = [
        {"params": [p for p in params if id(p) not in kept], "weight_decay": weight_decay},
        {"params": [p for p in params if id(p) in kept], "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


def no_decay_ids(model: torch.nn.Module) -> set[int]:
    """The ids of the parameters that decay="matrices" leaves undecayed (`param_groups`)."""
    kept = set()
    for module_name, module in model.named_modules(remove_duplicate=False):
        for name, p in module.named_parameters(recurse=False):
            parts = f"{module_name}.{name}".split(".") if module_name else [name]
            if (
                p.dim() < 2
                or isinstance(module, NO_DECAY_MODULES)
                or parts[-1] in NO_DECAY_NAMES
                or any(part.startswith(NO_DECAY_PREFIXES) for part in parts)
            ):
                kept.add(id(p))
    return kept


def fused_by_default(params: Iterable) -> bool:
    """Whether torch's fused optimizer kernels suit `params` (parameters or param groups): when
    every parameter is on CUDA, where they are fastest (what `fused=None` means here and in the config)."""
    return _all_cuda(list(params))


def _all_cuda(groups: list) -> bool:
    tensors = [p for g in groups for p in (g["params"] if isinstance(g, dict) else [g])]
    return bool(tensors) and all(isinstance(p, torch.Tensor) and p.is_cuda for p in tensors)


def _check_number(name: str, value: object, low: float, high: float | None = None, open_low: bool = False) -> None:
    ok = not isinstance(value, bool) and isinstance(value, (int, float))
    ok = ok and (value > low if open_low else value >= low) and (high is None or value < high)
    if not ok:
        bound = f"{'>' if open_low else '>='} {low}" + (f" and < {high}" if high is not None else "")
        raise ValueError(f"optim.{name} must be a number {bound}, got {value!r}")


def build_optimizer(
    name: str,
    params: Iterable,
    *,
    lr: float,
    weight_decay: float = 0.0,
    betas: tuple[float, float] | None = None,
    momentum: float | None = None,
    fused: bool | None = None,
) -> torch.optim.Optimizer:
    """Build "adamw" or "sgd" over `params` (tensors or param-group dicts).

    Args:
        name: "adamw" or "sgd".
        params: the parameters (e.g. `model.parameters()`), or a list of param groups.
        lr: base learning rate, > 0.
        weight_decay: decoupled (adamw) or L2 (sgd) weight decay, >= 0; a param group's
            own "weight_decay" (`param_groups`) wins.
        betas: adamw's two moment coefficients, each in [0, 1); None is ADAMW_BETAS
            (0.9, 0.95), the config's default. sgd warns when given them.
        momentum: sgd's momentum, >= 0; None is SGD_MOMENTUM (0.9), the config's
            default. adamw warns when given it.
        fused: use torch's fused implementation (one kernel for all parameters). None
            means "fused when every parameter is on CUDA", where it is fastest.

    Raises:
        ValueError: unknown name, an argument out of range, or no parameters.
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"optim name must be one of {', '.join(OPTIMIZERS)}, got {name!r}")
    groups = list(params)
    if not groups:
        raise ValueError("optim params is empty: the model has no parameters to train")
    _check_number("lr", lr, 0.0, open_low=True)
    _check_number("weight_decay", weight_decay, 0.0)
    if fused is None:
        fused = _all_cuda(groups)
    if name == "adamw":
        if momentum is not None:
            warnings.warn("optim 'adamw' ignores momentum (use betas)", stacklevel=2)
        betas = ADAMW_BETAS if betas is None else betas
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"optim.betas must be two numbers in [0, 1), got {betas!r}")
        for i, beta in enumerate(betas):
            _check_number(f"betas[{i}]", beta, 0.0, 1.0)
        return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), weight_decay=weight_decay, fused=fused)
    if betas is not None:
        warnings.warn("optim 'sgd' ignores betas (use momentum)", stacklevel=2)
    momentum = SGD_MOMENTUM if momentum is None else momentum
    _check_number("momentum", momentum, 0.0)
    return torch.optim.SGD(groups, lr=lr, momentum=momentum, weight_decay=weight_decay, fused=fused)
