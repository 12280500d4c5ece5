"""Data parallelism: clorch's DistributedDataParallel and its bucketed gradient reducer."""

from clorch.nn.parallel.ddp import DistributedDataParallel, no_sync, unwrap_model

__all__ = ["DistributedDataParallel", "no_sync", "unwrap_model"]
