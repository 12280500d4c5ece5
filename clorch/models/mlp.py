"""A small multilayer perceptron: `Linear(128, 32)` by default, optionally deeper."""

from __future__ import annotations

import torch
from torch import nn


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"MLP.{name} must be a positive int, got {value!r}")


class MLP(nn.Module):
    """Linear layers with GELU between them.

    `depth` counts the Linear layers: depth=1 is a single `Linear(in_features, out_features)`;
    depth=2 (the default) is `Linear(in, hidden) -> GELU -> Linear(hidden, out)`.

    Args:
        in_features: size of each input vector.
        hidden_features: width of the hidden layers (unused when depth is 1).
        out_features: size of each output vector.
        depth: number of Linear layers, >= 1.

    Raises:
        ValueError: a size or the depth is not a positive int.
    """

    def __init__(
        self, in_features: int = 128, hidden_features: int = 512, out_features: int = 32, depth: int = 2
    ) -> None:
        super().__init__()
        for name, value in (
            ("in_features", in_features),
            ("hidden_features", hidden_features),
            ("out_features", out_features),
            ("depth", depth),
        ):
            _check_positive_int(name, value)
        widths = [in_features] + [hidden_features] * (depth - 1) + [out_features]
        layers: list[nn.Module] = []
        for i in range(depth):
            if i > 0:
                layers.append(nn.GELU())
            layers.append(nn.Linear(widths[i], widths[i + 1]))
        self.net = nn.Sequential(*layers)
        self.in_features = in_features
        self.out_features = out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map `(..., in_features)` to `(..., out_features)`."""
        return self.net(x)

    def num_parameters(self) -> int:
        """Number of trainable scalars."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)
