"""clorch's DistributedDataParallel: a thin module around the bucketed reducer.

Synchronization points (every rank must reach them, in the same order):
construction (signature check, broadcast of parameters and buffers),
each forward when `broadcast_buffers=True` (broadcast of buffers), each
synchronized backward (bucket all-reduces start in hooks) and
`optimizer_step` (waits for them; with a scaler, one more all-reduce).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator

import torch
from torch import nn

from clorch.amp.scaler import GradScaler
from clorch.config.schema import REDUCE_DTYPE_NAMES
from clorch.distributed.process_group import is_initialized, world_size
from clorch.nn.parallel.reducer import Reducer
from clorch.nn.parallel.signature import broadcast_coalesced, check_signature

REDUCE_DTYPES = {name: getattr(torch, attr) for name, attr in REDUCE_DTYPE_NAMES.items()}
"""Names `reduce_dtype` accepts: the config schema's ddp.reduce_dtype choices, as torch dtypes.

Buckets whose gradients already have the dtype travel as they are (fp32 over
fp32 gradients is the same as None). fp16 is safe for the sum because every
rank divides by world_size before the all-reduce.
"""


def resolve_reduce_dtype(value: object) -> torch.dtype | None:
    """None, a name of `REDUCE_DTYPES` or a floating torch dtype; anything else is a ValueError."""
    if value is None or (isinstance(value, torch.dtype) and value.is_floating_point):
        return value  # type: ignore[return-value]
    if isinstance(value, str) and value in REDUCE_DTYPES:
        return REDUCE_DTYPES[value]
    names = ", ".join(repr(name) for name in REDUCE_DTYPES)
    raise ValueError(f"reduce_dtype must be None, one of {names} or a floating torch dtype "
                     f"(e.g. torch.bfloat16), got {value!r}")


def _check_cap(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0 (MiB), got {value!r}")
    return float(value)


def _check_options(find_unused_parameters: bool, gradient_as_bucket_view: bool) -> None:
    if find_unused_parameters:
        raise ValueError("find_unused_parameters=True is unsupported: every trainable parameter must "
                         "receive a gradient in each synchronized backward (set requires_grad=False "
                         "on unused ones); got find_unused_parameters=True")
    if gradient_as_bucket_view:
        raise ValueError("gradient_as_bucket_view=True is unsupported: gradients are committed into "
                         "reusable buckets by the reducer; got gradient_as_bucket_view=True")


class DistributedDataParallel(nn.Module):
    """Data parallelism over clorch's process group with clorch's own bucketed reducer.

    Construction is a synchronization point: every rank must wrap the same
    model. It checks the parameter signature across ranks (ValueError on every
    rank if it differs) and broadcasts parameters and buffers from rank 0.

    Args:
        model: the module, already on this rank's device.
        bucket_cap_mb: most MiB of gradients per bucket.
        first_bucket_cap_mb: most MiB in the first bucket (starts communication early).
        broadcast_buffers: broadcast buffers from rank 0 before each forward.
        reduce_dtype: None, a name in `REDUCE_DTYPES` ("fp32", "bf16", "fp16", ...)
            or a torch dtype buckets travel in.
        find_unused_parameters: unsupported; True raises ValueError.
        gradient_as_bucket_view: unsupported; True raises ValueError.
        skip_at_world_size_one: at world size 1 register no hooks and copy
            nothing; False runs the whole bucket path on one rank.

    Raises:
        TypeError: model is not an nn.Module.
        ValueError: a bad option, or parameter signatures differ across ranks.
    """

    def __init__(self, model: nn.Module, *, bucket_cap_mb: float = 25.0,
                 first_bucket_cap_mb: float = 1.0, broadcast_buffers: bool = True,
                 reduce_dtype: Any = None, find_unused_parameters: bool = False,
                 gradient_as_bucket_view: bool = False, skip_at_world_size_one: bool = True):
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        _check_options(find_unused_parameters, gradient_as_bucket_view)
        cap = _check_cap("bucket_cap_mb", bucket_cap_mb)
        first_cap = _check_cap("first_bucket_cap_mb", first_bucket_cap_mb)
        dtype = resolve_reduce_dtype(reduce_dtype)
        self.module = model
        size = world_size()
        named = list(model.named_parameters())
        if size > 1:
            check_signature(named)
            broadcast_coalesced([p.detach() for _, p in named] + list(model.buffers()))
        self._buffers_to_sync = list(model.buffers()) if broadcast_buffers and size > 1 else []
        self._reducer: Reducer | None = None
        self._covers: dict[tuple[int, int], bool] = {}
        if size > 1 or not skip_at_world_size_one:
            trainable = [(name, p) for name, p in named if p.requires_grad]
            self._reducer = Reducer([p for _, p in trainable], [n for n, _ in trainable], cap,
                                    first_cap, dtype, size, communicate=is_initialized())

    @property
    def buckets(self) -> list:
        """The reducer's buckets (empty when no reducer runs, e.g. at world size 1)."""
        return [] if self._reducer is None else self._reducer.buckets

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the model; with broadcast_buffers, every rank first receives rank 0's buffers."""
        if self._buffers_to_sync:
            broadcast_coalesced(self._buffers_to_sync)
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside only accumulate locally; the next synchronized one reduces the sum."""
        if self._reducer is None:
            yield
            return
        previous, self._reducer.sync = self._reducer.sync, False
        try:
            yield
        finally:
            self._reducer.sync = previous

    def optimizer_step(self, optimizer: torch.optim.Optimizer, scaler: Any = None) -> bool:
        """Wait for the reductions, commit them to `.grad`, step (through `scaler`) and zero grads.

        Every rank must call it after each synchronized backward. It blocks on
        the bucket all-reduces (no host sync on CUDA) and, with a scaler, on
        the scaler's found-inf all-reduce and its one host read.

        Returns:
            True when the optimizer stepped, False when the scaler skipped it.

        Raises:
            TypeError: optimizer has no step(), or scaler has no step().
            ValueError: a trainable parameter got no gradient (see Reducer.finish).
        """
        if not callable(getattr(optimizer, "step", None)):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if scaler is not None and not callable(getattr(scaler, "step", None)):
            raise TypeError(f"scaler must be a clorch.amp.GradScaler or None, got {type(scaler).__name__}")
        reducer = self._reducer
        if reducer is not None and not reducer.committed:
            reducer.finish()
        if scaler is None:
            optimizer.step()
            stepped = True
        else:
            if reducer is not None and isinstance(scaler, GradScaler) and self._optimizer_covers(optimizer):
                # Every gradient views a bucket: unscale a few flat buffers, not each parameter.
                scaler._unscale_flat_(optimizer, [bucket.flat for bucket in reducer.buckets])
            stepped = bool(scaler.step(optimizer))
        if reducer is not None:
            reducer.committed = False
        optimizer.zero_grad(set_to_none=True)
        return stepped

    def reduce_gradients(self) -> None:
        """Wait for this backward's reductions and commit the averages to `.grad` now.

        Between backward and this call (or `optimizer_step`) `.grad` holds this
        rank's gradient divided by world_size, not yet the average; call it to
        clip or inspect averaged gradients before `optimizer_step`, which then
        does not reduce again. Every rank must call it (it ends the bucket
        all-reduces); it blocks until they finish (no host sync on CUDA).

        Raises:
            ValueError: as `optimizer_step` for a missing gradient.
        """
        if self._reducer is not None and not self._reducer.committed:
            self._reducer.finish()

    def _optimizer_covers(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether `optimizer` holds exactly the reducer's parameters (cached per optimizer)."""
        key = (id(optimizer), sum(len(group["params"]) for group in optimizer.param_groups))
        covers = self._covers.get(key)
        if covers is None:
            ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
            covers = self._covers[key] = ids == self._reducer.param_ids
        return covers

    def state_dict(self, *args: Any, **kwargs: Any) -> dict:
        """The wrapped model's state dict (same keys as the unwrapped model)."""
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Load into the wrapped model (keys of the unwrapped model)."""
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def close(self) -> None:
        """Remove every hook (local; waits for reductions still in flight)."""
        if self._reducer is not None:
            self._reducer.remove()
            self._reducer = None

    def __enter__(self) -> "DistributedDataParallel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def no_sync(model: DistributedDataParallel) -> Iterator[None]:
    """Function form of `model.no_sync()`."""
    if not isinstance(model, DistributedDataParallel):
        raise TypeError(f"no_sync() takes a clorch DistributedDataParallel, got {type(model).__name__}")
    with model.no_sync():
        yield
