"""The optimizer a config names, over clorch's parameter groups: `build_optimizer(cfg, model)`."""

from __future__ import annotations

import torch
from torch import nn

from clorch.config import registry
from clorch.config.schema import TrainConfig
from clorch.optim import fused_by_default, param_groups


def build_optimizer(cfg: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer `cfg.optim` names (its `builds`), given its keys (`kwargs()`) and clorch's
    parameter groups (weight decay on `optim.decay`'s parameters only)."""
    optim = cfg.optim
    groups = param_groups(model, optim.weight_decay, optim.decay)
    kwargs = optim.kwargs()
    if "fused" in kwargs and kwargs["fused"] is None:
        kwargs["fused"] = fused_by_default(groups)
    return registry.resolve(optim.builds)(groups, **kwargs)
