"""torch's DDP communication hooks on clorch's buckets (`DistributedDataParallel.register_comm_hook`).

A hook replaces each bucket's all-reduce: when a bucket is full the reducer
calls `hook(state, bucket)` with an object that has the interface of
`torch.distributed.GradBucket`, and when backward ends it waits for the
Future the hook returned and brings its tensor into the bucket that `.grad`
views. As in torch, the bucket holds this rank's gradients *not* divided by
world_size: averaging is the hook's job (torch's hooks divide before the sum).

Only torch's elementwise built-in hooks are accepted (`ACCEPTED_HOOKS`): what
they compute for a gradient does not depend on which other gradients share its
bucket, so clorch's buckets (reverse registration order, `first_bucket_cap_mb`)
give the values torch's DDP gives with the same hook. Hooks that look across a
bucket (PowerSGD, quantization with one scale per bucket) or at torch's
reducer (ZeRO's) would see other buckets than torch's and are refused.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from clorch.nn.parallel.buckets import Bucket
from clorch.nn.parallel.reducer import Reducer

ACCEPTED_HOOKS: tuple[Callable, ...] = (
    default_hooks.allreduce_hook,
    default_hooks.fp16_compress_hook,
    default_hooks.bf16_compress_hook,
)
"""The hooks `register_comm_hook` takes: torch's, from torch.distributed.algorithms.ddp_comm_hooks.default_hooks."""


def check_comm_hook(hook: object) -> Callable:
    """The hook, if it is one of `ACCEPTED_HOOKS`.

    Raises:
        TypeError: hook is not callable.
        ValueError: another hook (its name and the accepted ones are given).
    """
    if not callable(hook):
        raise TypeError(f"register_comm_hook: hook must be callable, got {type(hook).__name__}")
    if not any(hook is accepted for accepted in ACCEPTED_HOOKS):
        names = ", ".join(f"default_hooks.{h.__name__}" for h in ACCEPTED_HOOKS)
        name = getattr(hook, "__qualname__", repr(hook))
        raise ValueError(
            f"register_comm_hook: clorch's DistributedDataParallel accepts torch's elementwise hooks "
            f"({names}, from torch.distributed.algorithms.ddp_comm_hooks), got {name!r}: clorch's "
            "buckets are not torch's, so a hook that looks across a bucket would compute other values "
            "(for bf16 or fp16 buckets without a hook, reduce_dtype= does the same pre-divided)"
        )
    return hook


class GradBucket:
    """One clorch bucket with the interface of `torch.distributed.GradBucket`.

    `buffer()` is the flat gradient buffer (the parameters' dtype) that `.grad`
    views; `gradients()` are its per-parameter views; `set_buffer(t)` replaces
    what `buffer()` returns (torch's compress wrappers use it).
    """

    def __init__(self, bucket: Bucket, params: Sequence[torch.nn.Parameter], count: int):
        self._bucket = bucket
        self._params = params
        self._count = count
        self._buffer = bucket.flat

    def index(self) -> int:
        """The bucket's index (0 is the one whose gradients arrive first)."""
        return self._bucket.index

    def is_last(self) -> bool:
        """Whether this is the last bucket of the backward."""
        return self._bucket.index == self._count - 1

    def buffer(self) -> torch.Tensor:
        """The flat gradients (this rank's, not divided by world_size)."""
        return self._buffer

    def set_buffer(self, tensor: torch.Tensor) -> None:
        """Make `buffer()` return `tensor` from now on (the bucket itself is not changed)."""
        self._buffer = tensor

    def gradients(self) -> list[torch.Tensor]:
        """The per-parameter views of the flat gradients, in `parameters()` order."""
        return list(self._bucket.grad_views)

    def parameters(self) -> list[torch.Tensor]:
        """The bucket's parameters."""
        return [self._params[i] for i in self._bucket.param_indices]


class HookWork:
    """The hook's Future, waited for like a collective's work; brings the result into the bucket."""

    def __init__(self, future: torch.futures.Future, bucket: Bucket):
        self._future = future
        self._bucket = bucket

    def wait(self) -> bool:
        """Wait for the hook's Future and copy its tensor into the bucket (unless it is the bucket).

        Raises:
            ValueError: the Future holds something other than one tensor of the bucket's size.
        """
        result = self._future.wait()
        flat = self._bucket.flat
        if isinstance(result, (list, tuple)) and len(result) == 1:
            result = result[0]
        if not isinstance(result, torch.Tensor) or result.numel() != flat.numel():
            raise ValueError(
                f"register_comm_hook: the hook's Future must hold one tensor of the "
                f"bucket's {flat.numel()} elements, got {result!r:.200}"
            )
        if result.data_ptr() != flat.data_ptr():
            flat.copy_(result.view(flat.shape))
        return True


class HookReducer(Reducer):
    """clorch's reducer whose buckets go through a communication hook instead of an all-reduce.

    Gradients are not pre-divided (the reducer runs with divisor 1); the hook
    averages. A collective when the hook is one (torch's are): every rank
    must register the same hook.
    """

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        names: Sequence[str],
        bucket_cap_mb: float,
        first_bucket_cap_mb: float,
        hook: Callable,
        state: Any,
    ):
        # world_size=1 makes the divisor 1; communicate=True makes each full bucket call _send.
        super().__init__(params, names, bucket_cap_mb, first_bucket_cap_mb, None, world_size=1, communicate=True)
        self.hook, self.state = hook, state

    def _send(self, bucket: Bucket) -> None:
        future = self.hook(self.state, GradBucket(bucket, self.params, len(self.buckets)))
        if not isinstance(future, torch._C.Future):  # what .then() returns is the C++ class
            raise TypeError(
                f"register_comm_hook: the hook must return a torch.futures.Future, got {type(future).__name__}"
            )
        bucket.work = HookWork(future, bucket)
