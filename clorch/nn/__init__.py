"""Neural-network helpers; data parallelism lives in `clorch.nn.parallel`."""

from clorch.nn import parallel

__all__ = ["parallel"]
