"""Tiny models, reproducible random data and one-process reference training for DDP tests."""

from __future__ import annotations

import copy
from typing import Callable

import torch
from torch import nn

IN, OUT = 6, 3


def mlp(dtype=torch.float64, seed=0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, OUT)).to(dtype)


class Tied(nn.Module):
    """Two layers sharing one weight (named_parameters lists it once)."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.a = nn.Linear(IN, IN).double()
        self.b = nn.Linear(IN, IN).double()
        self.b.weight = self.a.weight
        self.head = nn.Linear(IN, OUT).double()

    def forward(self, x):
        return self.head(torch.tanh(self.b(torch.tanh(self.a(x)))))


class TwoDtypes(nn.Module):
    """A float64 layer feeding a float32 layer: two bucket dtypes."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.a = nn.Linear(IN, 16).double()
        self.b = nn.Linear(16, OUT).float()

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)).float()).double()


class WithBatchNorm(nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.a = nn.Linear(IN, 16).double()
        self.bn = nn.BatchNorm1d(16).double()
        self.b = nn.Linear(16, OUT).double()

    def forward(self, x):
        return self.b(torch.tanh(self.bn(self.a(x))))


class Unused(nn.Module):
    """`unused` never takes part in forward: a missing gradient."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.used = nn.Linear(IN, OUT).double()
        self.unused = nn.Linear(IN, OUT).double()

    def forward(self, x):
        return self.used(x)


def frozen_mlp(seed=0) -> nn.Module:
    model = mlp(seed=seed)
    for p in model[0].parameters():
        p.requires_grad_(False)
    return model


def batches(steps: int, rows: int, seed: int = 7) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`steps` random (x, y) batches of `rows` rows (float64), the same in every process."""
    gen = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(rows, IN, generator=gen, dtype=torch.float64) * 1.5 + 0.3,
            torch.randn(rows, OUT, generator=gen, dtype=torch.float64),
        )
        for _ in range(steps)
    ]


def shard(batch: tuple[torch.Tensor, torch.Tensor], rank: int, world_size: int):
    x, y = batch
    return x.chunk(world_size)[rank], y.chunk(world_size)[rank]


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(out.to(y.dtype), y)


def make_optimizer(model: nn.Module, kind: str = "sgd") -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if kind == "adam":
        return torch.optim.Adam(params, lr=0.01)
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def reference(build: Callable[[], nn.Module], data, micro: int = 1, kind: str = "sgd") -> nn.Module:
    """One process, full batches: each step sums the gradients of `micro` consecutive batches."""
    model = build()
    opt = make_optimizer(model, kind)
    for start in range(0, len(data), micro):
        for x, y in data[start : start + micro]:
            loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return model


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def clone(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model)
