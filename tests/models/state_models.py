"""A model whose state holds what real models' does, for the state and buffer tests.

Named by `model._target_=tests.models.state_models.NormDropoutNet` with
CLORCH_TRUSTED_MODULES=tests.
"""

from __future__ import annotations

import torch
from torch import nn


class NormDropoutNet(nn.Module):
    """BatchNorm (running statistics, an int64 0-d counter), dropout, a learnable 0-d scale,
    one weight tied under two names and a bool buffer."""

    def __init__(self, in_features: int = 8, out_features: int = 4, hidden: int = 16, dropout: float = 0.1) -> None:
        super().__init__()
        self.inp = nn.Linear(in_features, hidden)
        self.norm = nn.BatchNorm1d(hidden)
        self.mix1 = nn.Linear(hidden, hidden)
        self.mix2 = nn.Linear(hidden, hidden, bias=False)
        self.mix2.weight = self.mix1.weight  # tied: one parameter, two state-dict names
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(hidden, out_features)
        self.scale = nn.Parameter(torch.tensor(1.0))  # a learnable scalar, as CLIP's logit scale
        mask = torch.ones(hidden, dtype=torch.bool)
        mask[-1] = False
        self.register_buffer("mask", mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(torch.relu(self.inp(x)))
        h = self.drop(torch.relu(self.mix2(torch.relu(self.mix1(h)))))
        return self.scale * self.out(h * self.mask)
