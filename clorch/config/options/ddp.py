"""The `ddp` group: clorch's gradient reducer (parallel=ddp)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from clorch.config.registry import Option, constant_of, declare, default_of, option, rule
from clorch.precision import DTYPE_NAMES

DDP = "clorch.nn.parallel.ddp:DistributedDataParallel"
ReduceDtype = Literal[(None, *DTYPE_NAMES)]  # type: ignore[valid-type]

declare("ddp", "clorch's gradient reducer under parallel=ddp: buckets, overlap", selector=None)


@option("ddp", "default")
@dataclass
class DDPConfig(Option):
    """clorch.nn.parallel.DistributedDataParallel settings."""

    bucket_cap_mb: float = field(
        default=constant_of("clorch.nn.parallel.ddp", "DEFAULT_BUCKET_CAP_MB"), metadata=rule(gt=0, unit="MiB")
    )  # gradient bucket size, MiB
    first_bucket_cap_mb: float = field(
        default=default_of(DDP, "first_bucket_cap_mb"), metadata=rule(gt=0, unit="MiB")
    )  # first bucket: starts communication early, MiB
    broadcast_buffers: bool = default_of(DDP, "broadcast_buffers")  # broadcast rank 0's buffers before each forward
    # dtype gradient buckets travel in; null: the gradients' own
    reduce_dtype: ReduceDtype = None
    # keep .grad in the buckets across zero_grad(set_to_none=True): backward accumulates in place
    gradient_as_bucket_view: bool = default_of(DDP, "gradient_as_bucket_view")
    # step each bucket's parameters as soon as its all-reduce is done, overlapping the optimizer
    # step with communication (same numerics; not with precision=fp16)
    step_in_backward: bool = False
    # CUDA: copy new gradients into their bucket on a side stream, one copy per full bucket
    overlap_grad_copies: bool = default_of(DDP, "overlap_grad_copies")

    def rules(self, cfg: Any) -> list[str]:
        if self.step_in_backward and cfg.optim is not None and cfg.optim.grad_clip is not None:
            return [
                f"optim.grad_clip={cfg.optim.grad_clip} cannot run with ddp.step_in_backward=true: each "
                "bucket's parameters are stepped before the whole gradient's norm is known "
                "(set optim.grad_clip=null or ddp.step_in_backward=false)"
            ]
        return []
