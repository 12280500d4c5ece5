"""Collectives over the initialized process group.

Contract shared by every function here:

* Every rank of the group must call the same collectives in the same order,
  with compatible shapes, dtypes, ops and split sizes (`send`/`recv` pair up
  two ranks instead). Set CLORCH_DEBUG_COLLECTIVES=1 to have the ranks compare
  a fingerprint first and raise `CollectiveMismatchError` instead of hanging.
* Tensors are changed in place. With `async_op=False` the call blocks until
  the result may be read (on CUDA: until it is ordered on the current stream)
  and returns None; with `async_op=True` it returns a `Work`, and the result
  may be read only after `wait(work)` / `work.wait()`.
* Arguments are checked locally before any communication; a bad one raises
  `TypeError`/`ValueError` naming it, on the rank that passed it.
* Communication failures (a peer died, the group timed out) surface as the
  backend's `RuntimeError`/`DistBackendError`.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.distributed as dist

from clorch.distributed import groups as pg
from clorch.distributed.debug import check_all_to_all_splits, check_fingerprint, check_recv, check_send

# torch 2.14 renamed the single-tensor gather/scatter; 2.11 (the GPU image) has only the old names.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

OPS = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.AVG,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "product": dist.ReduceOp.PRODUCT,
}


def failure_like(exc: RuntimeError, message: str) -> RuntimeError:
    """A communication failure restated with `message`, of the same class where it can be made.

    So that `except dist.DistBackendError` (and the like) in the caller's code still
    catches it; raise it `from exc` to keep the backend's error in the traceback.
    """
    try:
        restated = type(exc)(message)
    except Exception:  # noqa: BLE001 - a class that takes other arguments: fall back
        return RuntimeError(message)
    return restated if isinstance(restated, RuntimeError) else RuntimeError(message)


class Work:
    """Handle of an asynchronous collective; `wait()` before reading its tensors."""

    __slots__ = ("_work", "_finish")

    def __init__(self, work: dist.Work | None, finish: Callable[[], None] | None = None):
        self._work = work
        self._finish = finish

    def wait(self) -> bool:
        """Block until the result may be read. Raises the backend's error on failure."""
        if self._work is not None:
            self._work.wait()
        if self._finish is not None:
            finish, self._finish = self._finish, None
            finish()
        return True

    def is_completed(self) -> bool:
        """True when the communication has finished (the result may still need `wait`)."""
        return self._work is None or self._work.is_completed()


def wait(work: Work) -> bool:
    """Block until `work`'s result may be read; same as `work.wait()`."""
    if not isinstance(work, Work):
        raise TypeError(f"wait() takes the Work returned by an async_op=True call, got {work!r}")
    return work.wait()


def _require_group() -> None:
    if not dist.is_initialized():
        raise RuntimeError(
            "no process group is initialized: call inside clorch.distributed.process_group() "
            "or after init_process_group()"
        )


def _check_tensor(name: str, tensor: object) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_contiguous():
        raise ValueError(
            f"{name} must be contiguous, got strides {tuple(tensor.stride())} "
            f"for shape {tuple(tensor.shape)}: pass tensor.contiguous()"
        )
    device, expected = tensor.device, pg.device()  # the group's device: known since init
    if device != expected:
        raise ValueError(f"{name} must be on {expected} for backend {pg.backend()}, got a tensor on {device}")
    return tensor


_TORCH_OPS = {value: name for name, value in OPS.items()}
_PLAIN_OPS = {name: value for name, value in OPS.items() if name != "avg"}  # no division after


def _op_name(op: object) -> str:
    """A name of OPS, also for torch's `dist.ReduceOp.SUM`-style values."""
    if isinstance(op, str):
        return op
    try:
        return _TORCH_OPS.get(op, op)  # type: ignore[arg-type]
    except TypeError:  # an unhashable value: reported by _op
        return op  # type: ignore[return-value]


def _op(op: str, tensor: torch.Tensor) -> dist.ReduceOp:
    if not isinstance(op, str) or op not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)} (or torch's ReduceOp.SUM, ...), got {op!r}")
    if op == "avg" and not (tensor.is_floating_point() or tensor.is_complex()):
        raise ValueError(f"op 'avg' needs a floating-point tensor, got dtype {tensor.dtype}")
    return OPS[op]


def _check_rank(name: str, value: object) -> int:
    size = pg.world_size()
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
        raise ValueError(f"{name} must be a rank in [0, {size}), got {value!r}")
    return value


def _native_avg() -> bool:
    return pg.backend() == "nccl"


def _run(work: dist.Work | None, async_op: bool, finish: Callable[[], None] | None = None):
    if async_op:
        return Work(work, finish)
    if finish is not None:
        finish()
    return None


def _fast_op(tensor: object, op: object):
    """The reduce op when the usual call needs none of the checks below, else None.

    That is: a group clorch made and torch has not replaced since (checked on
    every call: about 0.05 us), not in debug mode, a plain tensor already on
    the group's device and contiguous, and an op named by a string that needs
    no division after (not "avg"). Each check costs tens of nanoseconds; the
    full path costs about a microsecond more a call.
    """
    state = pg._state  # clorch's record of the group it made (inlined pg._live_state())
    if (
        state is None
        or state.group is not pg._default_group()
        or state.debug
        or type(op) is not str
        or type(tensor) is not torch.Tensor
        or tensor.device != state.device
        or not tensor.is_contiguous()
    ):
        return None
    return _PLAIN_OPS.get(op)


def all_reduce(tensor: torch.Tensor, op: str = "sum", async_op: bool = False) -> Work | None:
    """Reduce `tensor` across all ranks; every rank ends with the result. All ranks call."""
    reduce_op = _fast_op(tensor, op)
    if reduce_op is not None:
        try:
            work = dist.all_reduce(tensor, reduce_op, None, async_op)
        except Exception:
            _require_group()  # the group was destroyed with torch.distributed directly: say so
            raise
        return Work(work) if async_op else None
    op = _op_name(op)
    _require_group()
    _check_tensor("tensor", tensor)
    reduce_op = _op(op, tensor)
    if pg.debug_enabled():
        check_fingerprint("all_reduce", op=op, shape=tuple(tensor.shape), dtype=str(tensor.dtype))
    if op == "avg" and not _native_avg():
        work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=async_op)
        return _run(work, async_op, lambda: tensor.div_(pg.world_size()))
    return _run(dist.all_reduce(tensor, op=reduce_op, async_op=async_op), async_op)


def broadcast(tensor: torch.Tensor, src: int = 0, async_op: bool = False) -> Work | None:
    """Copy rank `src`'s tensor into every other rank's. All ranks call, with the same src."""
    _require_group()
    _check_tensor("tensor", tensor)
    _check_rank("src", src)
    if pg.debug_enabled():
        check_fingerprint("broadcast", src=src, shape=tuple(tensor.shape), dtype=str(tensor.dtype))
    return _run(dist.broadcast(tensor, src=src, async_op=async_op), async_op)


def reduce(tensor: torch.Tensor, dst: int = 0, op: str = "sum", async_op: bool = False) -> Work | None:
    """Reduce into rank `dst`'s tensor; other ranks' tensors are unspecified after. All ranks call."""
    op = _op_name(op)
    _require_group()
    _check_tensor("tensor", tensor)
    _check_rank("dst", dst)
    reduce_op = _op(op, tensor)
    if pg.debug_enabled():
        check_fingerprint("reduce", dst=dst, op=op, shape=tuple(tensor.shape), dtype=str(tensor.dtype))
    if op == "avg" and not _native_avg():
        work = dist.reduce(tensor, dst=dst, op=dist.ReduceOp.SUM, async_op=async_op)
        finish = (lambda: tensor.div_(pg.world_size())) if pg.rank() == dst else None
        return _run(work, async_op, finish)
    return _run(dist.reduce(tensor, dst=dst, op=reduce_op, async_op=async_op), async_op)


def _check_stacked(out_name: str, out: torch.Tensor, in_name: str, inp: torch.Tensor) -> None:
    """`out` must be world_size copies of `inp` stacked along dim 0."""
    size = pg.world_size()
    if out.dtype != inp.dtype:
        raise ValueError(f"{out_name} must have {in_name}'s dtype {inp.dtype}, got {out.dtype}")
    if inp.dim() == 0:
        expected = (size,)
    else:
        expected = (inp.shape[0] * size, *inp.shape[1:])
    if tuple(out.shape) != tuple(expected):
        raise ValueError(
            f"{out_name} must have shape {tuple(expected)} (world_size {size} x "
            f"{in_name} {tuple(inp.shape)} along dim 0), got {tuple(out.shape)}"
        )


def all_gather_into(output: torch.Tensor, tensor: torch.Tensor, async_op: bool = False) -> Work | None:
    """Gather every rank's `tensor` into `output`, rank order along dim 0. All ranks call."""
    _require_group()
    _check_tensor("output", output)
    _check_tensor("tensor", tensor)
    _check_stacked("output", output, "tensor", tensor)
    if pg.debug_enabled():
        check_fingerprint("all_gather_into", shape=tuple(tensor.shape), dtype=str(tensor.dtype))
    work = _all_gather_single(output, tensor, async_op=async_op)
    return _run(work, async_op)


def reduce_scatter_into(
    output: torch.Tensor, tensor: torch.Tensor, op: str = "sum", async_op: bool = False
) -> Work | None:
    """Reduce `tensor` across ranks and keep this rank's dim-0 chunk in `output`. All ranks call."""
    op = _op_name(op)
    _require_group()
    _check_tensor("output", output)
    _check_tensor("tensor", tensor)
    _check_stacked("tensor", tensor, "output", output)
    reduce_op = _op(op, tensor)
    if pg.debug_enabled():
        check_fingerprint("reduce_scatter_into", op=op, shape=tuple(tensor.shape), dtype=str(tensor.dtype))
    if pg.backend() == "nccl":
        return _run(_reduce_scatter_single(output, tensor, op=reduce_op, async_op=async_op), async_op)
    # gloo has no reduce-scatter: all-reduce a copy, keep our chunk (correct, more bytes).
    scratch = tensor.clone()
    native = dist.ReduceOp.SUM if op == "avg" else reduce_op
    work = dist.all_reduce(scratch, op=native, async_op=async_op)

    def finish() -> None:
        chunk = scratch.chunk(pg.world_size())[pg.rank()]
        output.copy_(chunk.view_as(output))
        if op == "avg":
            output.div_(pg.world_size())

    return _run(work, async_op, finish)


def _check_splits(name: str, splits: Sequence[int] | None, tensor_name: str, tensor: torch.Tensor) -> list[int] | None:
    size = pg.world_size()
    rows = tensor.shape[0] if tensor.dim() else 1
    if splits is None:
        if rows % size:
            raise ValueError(
                f"{tensor_name} dim 0 ({rows}) must divide evenly by world_size {size} when {name} is None"
            )
        return None
    splits = list(splits)
    if len(splits) != size or any(not isinstance(s, int) or s < 0 for s in splits):
        raise ValueError(f"{name} must be {size} non-negative ints (one per rank), got {splits}")
    if sum(splits) != rows:
        raise ValueError(f"{name} must add up to {tensor_name} dim 0 ({rows}), got sum {sum(splits)} from {splits}")
    return splits


def all_to_all_single(
    output: torch.Tensor,
    tensor: torch.Tensor,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    async_op: bool = False,
) -> Work | None:
    """Scatter dim-0 slices of `tensor` to every rank and gather theirs into `output`. All ranks call."""
    _require_group()
    _check_tensor("output", output)
    _check_tensor("tensor", tensor)
    if output.dtype != tensor.dtype:
        raise ValueError(f"output must have tensor's dtype {tensor.dtype}, got {output.dtype}")
    out_splits = _check_splits("output_split_sizes", output_split_sizes, "output", output)
    in_splits = _check_splits("input_split_sizes", input_split_sizes, "tensor", tensor)
    if pg.debug_enabled():
        check_fingerprint("all_to_all_single", dtype=str(tensor.dtype), trailing=tuple(tensor.shape[1:]))
        size = pg.world_size()
        check_all_to_all_splits(
            in_splits or [tensor.shape[0] // size] * size, out_splits or [output.shape[0] // size] * size
        )
    work = dist.all_to_all_single(output, tensor, out_splits, in_splits, async_op=async_op)
    return _run(work, async_op)


def _check_peer(name: str, peer: object) -> int:
    _check_rank(name, peer)
    if peer == pg.rank():
        raise ValueError(f"{name} must be another rank than this one ({pg.rank()}), got {peer}")
    return peer  # type: ignore[return-value]


def send(tensor: torch.Tensor, dst: int, async_op: bool = False) -> Work | None:
    """Send `tensor` to rank `dst`, which must call `recv` with a tensor of the same shape and dtype."""
    _require_group()
    _check_tensor("tensor", tensor)
    _check_peer("dst", dst)
    if pg.debug_enabled():
        check_send(tensor, dst)
    if async_op:
        return Work(dist.isend(tensor, dst))
    dist.send(tensor, dst)
    return None


def recv(tensor: torch.Tensor, src: int, async_op: bool = False) -> Work | None:
    """Receive into `tensor` from rank `src`, which must call `send`. Blocks until it arrives."""
    _require_group()
    _check_tensor("tensor", tensor)
    _check_peer("src", src)
    if pg.debug_enabled():
        check_recv(tensor, src)
    if async_op:
        return Work(dist.irecv(tensor, src))
    dist.recv(tensor, src)
    return None


def barrier(async_op: bool = False) -> Work | None:
    """Block until every rank has reached the barrier. All ranks call."""
    _require_group()
    if pg.debug_enabled():
        check_fingerprint("barrier")
    if pg.backend() == "nccl":
        # NCCL's barrier guesses a device; name ours so it never touches another GPU.
        return _run(dist.barrier(async_op=async_op, device_ids=[pg.device().index]), async_op)
    return _run(dist.barrier(async_op=async_op), async_op)
