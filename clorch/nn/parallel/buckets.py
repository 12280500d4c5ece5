"""Bucket planning and the flat, reusable gradient buckets of the reducer.

Planning is a pure function of the parameters' sizes and dtypes, so every rank
that passed the signature check plans identical buckets and launches their
all-reduces in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from clorch.distributed.collectives import failure_like

MIB = 1024 * 1024


def plan_buckets(params: Sequence[torch.Tensor], bucket_cap_mb: float, first_bucket_cap_mb: float) -> list[list[int]]:
    """Group parameter indices into buckets; bucket 0 is the one whose gradients arrive first.

    Parameters are visited in reverse registration order because autograd
    produces gradients in roughly that order during backward: the last layer's
    gradient is ready first, so its bucket can start communicating while the
    earlier layers are still being differentiated. Each (dtype, device) fills
    its own open bucket (a bucket is one flat tensor, so one dtype); the first
    bucket of each has the smaller `first_bucket_cap_mb` so communication starts
    early. A parameter larger than the cap gets a bucket of its own.

    Args:
        params: trainable parameters in registration order.
        bucket_cap_mb: most MiB of gradient per bucket.
        first_bucket_cap_mb: most MiB in the first bucket of each dtype.

    Returns:
        Buckets as lists of indices into `params`, ordered by the arrival of
        their first gradient.
    """
    open_buckets: dict[tuple, list[int]] = {}
    open_bytes: dict[tuple, int] = {}
    closed_count: dict[tuple, int] = {}
    done: list[list[int]] = []

    def cap(key: tuple) -> float:
        return (first_bucket_cap_mb if closed_count.get(key, 0) == 0 else bucket_cap_mb) * MIB

    def close(key: tuple) -> None:
        done.append(open_buckets.pop(key))
        open_bytes.pop(key)
        closed_count[key] = closed_count.get(key, 0) + 1

    for index in reversed(range(len(params))):
        param = params[index]
        key = (param.dtype, param.device)
        size = param.numel() * param.element_size()
        if key in open_buckets and open_bytes[key] + size > cap(key):
            close(key)
        open_buckets.setdefault(key, []).append(index)
        open_bytes[key] = open_bytes.get(key, 0) + size
        if open_bytes[key] >= cap(key):
            close(key)
    done.extend(open_buckets.values())
    # Launch order follows the arrival of each bucket's first gradient.
    arrival = {index: position for position, index in enumerate(reversed(range(len(params))))}
    return sorted(done, key=lambda bucket: arrival[bucket[0]])


@dataclass
class Bucket:
    """One flat gradient buffer and the views that map it onto its parameters.

    `flat` holds the gradients in the parameters' dtype and is what `.grad`
    views after commit; `comm` is what travels (the same tensor, or a
    `reduce_dtype` copy of it).
    """

    index: int
    param_indices: list[int]
    flat: torch.Tensor
    comm: torch.Tensor
    grad_views: list[torch.Tensor]
    comm_views: list[torch.Tensor]
    filled: int = 0
    copied: list[int] = field(default_factory=list)  # slots filled with a new gradient this backward
    pending: list = field(default_factory=list)  # (slot, new gradient) noted by a hook, copied when the bucket is full
    handed: bool = False  # its all-reduce and step were queued on the step_in_backward side stream
    work: object = None
    names: list[str] = field(default_factory=list)

    @property
    def converts(self) -> bool:
        """True when the bucket travels in another dtype than its gradients."""
        return self.comm is not self.flat


def wait_for_reduction(work, bucket: Bucket) -> None:
    """Wait for `bucket`'s all-reduce; a failed one names the bucket and what usually causes it.

    Local: the collective itself was started on every rank. On CUDA it only
    orders the result on the current stream (no host wait).

    Raises:
        RuntimeError: the process group failed (a timeout, a dead peer), as the
            backend's class (DistBackendError, say), its message kept.
    """
    try:
        work.wait()
    except RuntimeError as exc:
        raise _reduction_failure(exc, bucket) from exc


def _reduction_failure(exc: RuntimeError, bucket: Bucket) -> RuntimeError:
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    names = ", ".join(bucket.names[:3]) + (", ..." if len(bucket.names) > 3 else "")
    return failure_like(
        exc,
        (
            f"DistributedDataParallel: the gradient all-reduce of the bucket holding {names} failed on "
            f"rank {rank} ({type(exc).__name__}: {exc}). Every rank must run the same synchronized "
            "backward: a peer that died, is stuck, or called another collective instead "
            "(save_checkpoint on rank 0 only, say) leaves this rank waiting here until the collective "
            "timeout. HINT: CLORCH_DEBUG_COLLECTIVES=1 makes clorch's collectives name the one each "
            "rank called"
        ),
    )


def _views(flat: torch.Tensor, shapes: Sequence[torch.Size]) -> list[torch.Tensor]:
    views, offset = [], 0
    for shape in shapes:
        numel = shape.numel()
        views.append(flat[offset : offset + numel].view(shape))
        offset += numel
    return views


def build_buckets(
    params: Sequence[torch.Tensor], names: Sequence[str], plan: list[list[int]], reduce_dtype: torch.dtype | None
) -> list[Bucket]:
    """Allocate one flat buffer per planned bucket (plus a comm buffer when converting)."""
    buckets = []
    for index, members in enumerate(plan):
        first = params[members[0]]
        shapes = [params[i].shape for i in members]
        numel = sum(shape.numel() for shape in shapes)
        flat = torch.zeros(numel, dtype=first.dtype, device=first.device)
        comm = flat
        if reduce_dtype is not None and first.dtype.is_floating_point and first.dtype != reduce_dtype:
            comm = torch.zeros(numel, dtype=reduce_dtype, device=first.device)
        grad_views = _views(flat, shapes)
        comm_views = grad_views if comm is flat else _views(comm, shapes)
        buckets.append(
            Bucket(index, list(members), flat, comm, grad_views, comm_views, names=[names[i] for i in members])
        )
    return buckets
