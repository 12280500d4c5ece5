"""One class per `parallel` mode: what a rank's loop asks of the mode (`clorch.strategies.base.Strategy`).

`DDPStrategy` (clorch.strategies.ddp), `ExactDDPStrategy` (its exact=true form,
clorch.strategies.exact), `FSDPStrategy` (clorch.strategies.fsdp) and
`ExactFSDPStrategy` (its exact=true form, clorch.strategies.exact_fsdp); a
`parallel` option names its class as a string (`strategy`), so a mode of your own is
one class plus its option (docs/extending.md, "A parallel mode").
"""

from typing import Any

import torch
from torch import nn

from clorch.nn.parallel.fsdp import ShardedTrainer
from clorch.strategies.base import ModelSource, Strategy, strategy_class, weights_digest
from clorch.strategies.ddp import DDPStrategy
from clorch.strategies.exact import ExactDDPStrategy
from clorch.strategies.exact_fsdp import ExactFSDPStrategy
from clorch.strategies.fsdp import FSDPStrategy

__all__ = [
    "DDPStrategy",
    "ExactDDPStrategy",
    "ExactFSDPStrategy",
    "FSDPStrategy",
    "ModelSource",
    "Strategy",
    "adopt",
    "strategy_class",
    "weights_digest",
]


def adopt(
    model: Any,
    raw_model: nn.Module,
    optimizer: torch.optim.Optimizer,
    precision: Any,
    device: torch.device,
    rank: int = 0,
    world_size: int = 1,
) -> Strategy:
    """The strategy around a model wrapped by hand (a training loop's components built without
    `build_components`, as a benchmark does): `FSDPStrategy` around a `ShardedTrainer`, else
    `DDPStrategy` around clorch's `DistributedDataParallel`. Its `setup` is not called."""
    cls = FSDPStrategy if isinstance(model, ShardedTrainer) else DDPStrategy
    strategy = cls(precision, device, rank, world_size)
    strategy.model, strategy.raw_model, strategy.optimizer = model, raw_model, optimizer
    return strategy
