"""Small images that make themselves: stripes in one of four directions, on noise.

Item i is (image, label): a float32 (3, size, size) image and the int64 direction (0: horizontal,
1: vertical, 2: diagonal, 3: anti-diagonal) of its stripes, with a random colour, phase and
period per image, and Gaussian noise. A map-style torch Dataset that takes `split`, so clorch
builds it with split="train" and split="eval" (different images); the same arguments give the
same items.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import Dataset

CLASSES = 4


class Stripes(Dataset):
    def __init__(
        self, sample_count: int = 2048, size: int = 16, noise: float = 0.5, split: str = "train", seed: int = 0
    ):
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        gen = torch.Generator().manual_seed(seed * 2 + (split == "eval"))
        self.labels = torch.randint(0, CLASSES, (sample_count,), generator=gen)
        rows, cols = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
        along = torch.stack([rows, cols, rows + cols, rows - cols]).float()  # (4, size, size)
        period = 3 + 3 * torch.rand(sample_count, 1, 1, generator=gen)
        phase = 2 * math.pi * torch.rand(sample_count, 1, 1, generator=gen)
        wave = torch.sin(2 * math.pi * along[self.labels] / period + phase)  # (n, size, size)
        colour = torch.rand(sample_count, 3, 1, 1, generator=gen) * 2 - 1
        self.images = colour * wave[:, None] + noise * torch.randn(sample_count, 3, size, size, generator=gen)

    def __len__(self) -> int:
        return self.labels.numel()

    def __getitem__(self, index: int):
        return self.images[index], self.labels[index]
