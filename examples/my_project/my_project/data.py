"""Two interleaved spirals in the plane: a map-style torch Dataset that makes its own data."""

import math

import torch
from torch.utils.data import Dataset


class Spirals(Dataset):
    """Item i is (point, arm): a float32 (x, y) and the int64 arm (0 or 1) it lies on.

    Takes `split`, so clorch builds it once with split="train" and once with split="eval"
    (the two draw different points). The same arguments give the same items.
    """

    def __init__(
        self, sample_count: int = 2048, noise: float = 0.05, turns: float = 1.5, split: str = "train", seed: int = 0
    ):
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        gen = torch.Generator().manual_seed(seed * 2 + (split == "eval"))
        self.labels = torch.randint(0, 2, (sample_count,), generator=gen)
        radius = torch.rand(sample_count, generator=gen)
        angle = radius * turns * 2 * math.pi + self.labels * math.pi
        points = torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], dim=1)
        self.points = points + noise * torch.randn(sample_count, 2, generator=gen)

    def __len__(self) -> int:
        return self.labels.numel()

    def __getitem__(self, index: int):
        return self.points[index], self.labels[index]
