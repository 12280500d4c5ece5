"""Data parallelism: clorch's DistributedDataParallel and its bucketed gradient reducer."""

from clorch.nn.parallel.ddp import DistributedDataParallel, no_sync

__all__ = ["DistributedDataParallel", "no_sync"]
