"""Data for distributed training: the resumable distributed sampler (and datasets beside it)."""

from __future__ import annotations

from clorch.data.sampler import DistributedSampler

__all__ = ["DistributedSampler"]
