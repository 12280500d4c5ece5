"""A torchvision-style ResNet (basic blocks, BatchNorm), built from torch.nn alone.

    clorch-train model._target_=clorch.models.resnet.ResNet model.num_classes=10 ...

The layout of torchvision's `resnet18` (`layers=(2, 2, 2, 2)`, `width=64`):
a stem, four stages of basic blocks that halve the resolution and double the
width after the first, global average pooling and a linear head. For small
images (CIFAR-sized), `small_input=True` (the default) uses a 3x3 stem
without the max-pool. Its state holds what real models hold: BatchNorm's
running statistics and its int64 `num_batches_tracked` (a 0-d buffer).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with BatchNorm and a residual connection (torchvision's BasicBlock)."""

    def __init__(self, in_channels: int, channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_channels != channels:  # the shortcut must match the new shape
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False), nn.BatchNorm2d(channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


class ResNet(nn.Module):
    """Images `(batch, in_channels, height, width)` to class logits `(batch, num_classes)`.

    Args:
        num_classes: outputs of the linear head.
        in_channels: channels of the input images (3 for RGB).
        layers: basic blocks per stage; torchvision's resnet18 is (2, 2, 2, 2).
        width: channels of the first stage; each later stage doubles them.
        small_input: a 3x3 stride-1 stem without max-pool (for 32x32 images) instead of
            torchvision's 7x7 stride-2 stem and max-pool (for 224x224).

    Raises:
        ValueError: a count that is not a positive int, or no stage.
    """

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        layers: Sequence[int] = (2, 2, 2, 2),
        width: int = 64,
        small_input: bool = True,
    ) -> None:
        super().__init__()
        layers = list(layers)
        for name, value in (
            ("num_classes", num_classes),
            ("in_channels", in_channels),
            ("width", width),
            *((f"layers[{i}]", n) for i, n in enumerate(layers)),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ResNet.{name} must be a positive int, got {value!r}")
        if not layers:
            raise ValueError("ResNet.layers must name at least one stage, got []")
        if small_input:
            stem: list[nn.Module] = [nn.Conv2d(in_channels, width, 3, padding=1, bias=False)]
        else:
            stem = [nn.Conv2d(in_channels, width, 7, stride=2, padding=3, bias=False)]
        stem += [nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
        if not small_input:
            stem.append(nn.MaxPool2d(3, stride=2, padding=1))
        self.stem = nn.Sequential(*stem)
        stages, channels = [], width
        for i, blocks in enumerate(layers):
            out = width * 2**i
            stage = [BasicBlock(channels, out, stride=1 if i == 0 else 2)]
            stage += [BasicBlock(out, out) for _ in range(blocks - 1)]
            stages.append(nn.Sequential(*stage))
            channels = out
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)
        for module in self.modules():  # torchvision's initialization
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.stages(self.stem(x))), 1))
