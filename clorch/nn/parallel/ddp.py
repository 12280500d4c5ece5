"""clorch's DistributedDataParallel: torch's DDP interface on clorch's bucketed reducer.

Synchronization points (every rank must reach them, in the same order):
construction (signature check, broadcast of parameters and buffers), each
forward when `broadcast_buffers=True` (broadcast of buffers), and each
synchronized backward (bucket all-reduces start in hooks and are waited for
when backward ends, so `.grad` holds the average when `backward()` returns).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import nn

from clorch.distributed.groups import check_group_joined, world_size
from clorch.nn.parallel.comm_hooks import HookReducer
from clorch.nn.parallel.options import (
    check_arguments,
    check_cap,
    check_device_ids,
    resolve_reduce_dtype,
)
from clorch.nn.parallel.overlap import BucketStepper
from clorch.nn.parallel.reducer import Reducer
from clorch.nn.parallel.signature import broadcast_coalesced, check_signature
from clorch.nn.parallel.torch_ddp import TorchDDPInterface, refuse_torch_internals

DEFAULT_BUCKET_CAP_MB = 25.0
"""MiB per bucket when `bucket_cap_mb` is None (torch's DDP default; the config's default too)."""


def _agree_on_start(module: nn.Module, init_sync: bool) -> None:
    """Collective: check the parameter signature across ranks (ValueError on every rank if it
    differs) and, with `init_sync`, broadcast rank 0's parameters and buffers."""
    named = list(module.named_parameters())
    check_signature(named)
    if init_sync:
        broadcast_coalesced([p.detach() for _, p in named] + list(module.buffers()))


def _inside_backward() -> bool:
    """Whether this thread is running a backward pass (e.g. a checkpointed forward recomputed)."""
    current = getattr(torch._C, "_current_graph_task_id", None)
    return current is not None and current() != -1


def _to_device(value: Any, device: torch.device) -> Any:
    """Inputs moved to the module's device, as torch's DDP does when device_ids is given."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_device(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    return value


@refuse_torch_internals
class DistributedDataParallel(TorchDDPInterface):
    """Data parallelism over the default process group with clorch's own bucketed reducer.

    Takes torch's `DistributedDataParallel` arguments, so a torch DDP script
    runs by changing the import. It is a subclass of
    `torch.nn.parallel.DistributedDataParallel` (so isinstance checks and
    unwrap helpers see a DDP) with torch's public attributes (`module`,
    `device_ids`, `output_device`, `dim`, `broadcast_buffers`,
    `find_unused_parameters`, `process_group`, `bucket_bytes_cap`,
    `static_graph`, `gradient_as_bucket_view`, `device`), `no_sync()`,
    `register_comm_hook` (torch's elementwise hooks) and `_set_static_graph()`;
    torch's `__init__` and reducer never run, and torch's internals that would
    need them (`join`, `_register_fused_optim`, ...) raise NotImplementedError. As with torch's DDP,
    `.grad` holds the average over ranks when a synchronized `backward()` returns (step with
    `optimizer.step()` or `clorch.strategies.DDPStrategy`; the wrapper never steps); forwards inside
    `no_sync()` (or with `require_backward_grad_sync = False`) make their
    backward accumulate locally instead. Construction is a synchronization
    point: every rank must wrap the same model. It checks the parameter
    signature across ranks (ValueError on every rank if it differs) and
    broadcasts parameters and buffers from rank 0.

    Outside a process group it runs as a world of 1, unless WORLD_SIZE > 1
    says this process is a rank of a launched job: then construction raises
    RuntimeError (see `clorch.distributed.groups.check_group_joined`), where
    every rank would otherwise train alone.

    At world size 1 there is nothing to average, so (unless `step_in_backward`
    or `register_comm_hook` is used) no hooks are registered:
    backward leaves autograd's own `.grad` and `buckets` is empty. (torch's
    DDP copies every gradient into a bucket there too; skipping that keeps a
    one-GPU job as fast as the plain model.)

    Args:
        module: the model, already on this rank's device.
        device_ids: None, or `[d]` naming the device the module is on (an int
            index, "cuda:N" or a torch.device); inputs are then moved there.
        output_device: None or the same device as `device_ids`.
        dim: accepted for torch compatibility (single-device modules do not scatter).
        broadcast_buffers: broadcast rank 0's buffers before each forward.
        init_sync: broadcast rank 0's parameters and buffers at construction.
        process_group: None or the default group (clorch reduces over the whole job).
        bucket_cap_mb: most MiB of gradients per bucket (None: `DEFAULT_BUCKET_CAP_MB`, 25).
        find_unused_parameters: unsupported; True raises ValueError.
        check_reduction: ignored (deprecated in torch).
        gradient_as_bucket_view: `.grad` is a view of its bucket after every
            synchronized backward either way. With True it stays one: before
            each forward, a `.grad` that `zero_grad(set_to_none=True)` removed
            is pointed back at its zeroed bucket slot (so between that forward
            and backward it is zeros, not None), and backward accumulates into
            the buckets in place instead of allocating and copying each
            gradient.
        static_graph: recorded in `static_graph`, nothing else (the reducer
            needs no graph analysis); `_set_static_graph()` likewise.
        first_bucket_cap_mb: most MiB in the first bucket (starts communication early).
        reduce_dtype: the dtype buckets travel in: None (the gradients' own), a
            name of `clorch.precision.DTYPE_NAMES` ("fp32", "bf16", "fp16", ...)
            or a floating torch dtype (see `resolve_reduce_dtype`).
        overlap_grad_copies: on CUDA, copy new gradients into their bucket on
            a side stream once the bucket is full (one multi-tensor copy where
            it travels in the gradients' dtype), overlapping the rest of
            backward, instead of one copy per gradient in its hook (ignored on
            CPU). Same values either way; the copied gradients stay allocated
            until the end of backward, up to one more set of gradients at peak
            (124M fp32 parameters: about 500 MB). Without it, where nothing is
            divided (one rank, buckets in the gradients' dtype), each bucket's
            gradients are also copied together, on the current stream.

    Raises:
        TypeError: module is not an nn.Module, or overlap_grad_copies is not a bool.
        ValueError: a bad or unsupported option, or parameter signatures differ across ranks.
        RuntimeError: no process group is initialized but WORLD_SIZE > 1.
    """

    def __init__(
        self,
        module: nn.Module,
        device_ids: Any = None,
        output_device: Any = None,
        dim: int = 0,
        broadcast_buffers: bool | None = True,
        init_sync: bool = True,
        process_group: Any = None,
        bucket_cap_mb: float | None = None,
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        delay_all_reduce_named_params: Any = None,
        param_to_hook_all_reduce: Any = None,
        mixed_precision: Any = None,
        device_mesh: Any = None,
        skip_all_reduce_unused_params: bool = False,
        *,
        first_bucket_cap_mb: float = 1.0,
        reduce_dtype: Any = None,
        overlap_grad_copies: bool = False,
        **torch_only: Any,
    ):
        nn.Module.__init__(self)  # not torch's DDP __init__: that would build torch's reducer
        unsupported = dict(
            find_unused_parameters=find_unused_parameters,
            delay_all_reduce_named_params=delay_all_reduce_named_params,
            param_to_hook_all_reduce=param_to_hook_all_reduce,
            mixed_precision=mixed_precision,
            device_mesh=device_mesh,
            skip_all_reduce_unused_params=skip_all_reduce_unused_params,
            **torch_only,
        )
        check_arguments(module, process_group, overlap_grad_copies, unsupported)
        self._input_device = check_device_ids(module, device_ids, output_device)
        cap = DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
        check_cap("bucket_cap_mb", cap)
        check_cap("first_bucket_cap_mb", first_bucket_cap_mb)
        cap, first_cap = float(cap), float(first_bucket_cap_mb)
        dtype = resolve_reduce_dtype(reduce_dtype)
        check_group_joined("DistributedDataParallel")
        size = world_size()
        self.module = module
        self._set_torch_attributes(process_group, dim, cap, bucket_cap_mb is None)
        self.static_graph = bool(static_graph)
        self.gradient_as_bucket_view = bool(gradient_as_bucket_view)
        self.require_backward_grad_sync = True
        if size > 1:
            _agree_on_start(module, init_sync)
        self._covers: dict[tuple[int, int], bool] = {}
        self._reducer_args = (cap, first_cap, dtype, size)
        self.broadcast_buffers = broadcast_buffers is None or bool(broadcast_buffers)
        self.overlap_grad_copies = overlap_grad_copies
        self._forwarded = False  # register_comm_hook is refused once a forward ran
        self._reducer: Reducer | None = self._build_reducer() if size > 1 else None

    def _build_reducer(self, communicate: bool | None = None, comm_hook: tuple | None = None) -> Reducer:
        trainable = [(name, p) for name, p in self.module.named_parameters() if p.requires_grad]
        if comm_hook is not None:
            cap, first_cap = self._reducer_args[:2]
            return HookReducer([p for _, p in trainable], [n for n, _ in trainable], cap, first_cap, *comm_hook)
        return Reducer(
            [p for _, p in trainable],
            [n for n, _ in trainable],
            *self._reducer_args,
            communicate=communicate,
            overlap_grad_copies=self.overlap_grad_copies,
        )

    def _run_bucket_path(self) -> None:
        """Run the whole bucket path even at world size 1 (each bucket all-reduced to this rank alone).

        For benchmarks that measure the reducer where a one-rank job skips it.
        Local; call it before the first forward, on a model without a reducer.

        Raises:
            ValueError: the model has a reducer already (world size > 1, or step_in_backward).
        """
        if self._reducer is not None:
            raise ValueError("_run_bucket_path(): this model already has a reducer; call it first")
        self._reducer = self._build_reducer(communicate=True)

    def step_in_backward(self, optimizer: torch.optim.Optimizer) -> None:
        """Let each synchronized backward also step `optimizer`, bucket by bucket.

        From now on, when a synchronized `backward()` returns, `.grad` holds
        the average (as always) and the parameters have been stepped:
        each bucket's parameters as soon as its all-reduce was done, so the
        step overlaps the communication of later buckets (on CUDA, on a side
        stream; see `clorch.nn.parallel.overlap`). The numerics are those of
        `optimizer.step()` after backward. Do not call `optimizer.step()`
        any more (it raises ValueError); zero the gradients as before (a
        `DDPStrategy`'s `optimizer_step` then only zeroes them).
        Forwards under `no_sync()` still accumulate without stepping.

        Step hooks registered on the optimizer (`register_step_pre_hook`,
        `register_step_post_hook`) do not run; torch's global optimizer hooks
        may run once per bucket. Each bucket steps a copy of the optimizer
        made here: hyperparameters in `param_groups` and the `state` are read
        from the optimizer at every step, other attributes as they are now.

        Not for steps that must see every gradient first: gradient clipping by
        the global norm, or fp16 loss scaling (its skip decision needs every
        bucket), and not for LBFGS. Works at world size 1 too (buckets are
        filled, nothing is communicated). Local: call it on every rank, before
        the next backward.

        Raises:
            TypeError: optimizer is not a torch.optim.Optimizer.
            ValueError: it does not hold exactly the model's trainable
                parameters, needs every parameter at once (LBFGS), or an
                optimizer was already handed over.
        """
        if isinstance(self._reducer, HookReducer):
            raise ValueError(
                "step_in_backward() cannot be combined with register_comm_hook(): the "
                "hook's Future, not clorch's all-reduce, completes each bucket"
            )
        if self._reducer is None:
            self._reducer = self._build_reducer()
        reducer = self._reducer
        if reducer.stepper is not None:
            raise ValueError(
                "step_in_backward() was already called on this model "
                f"(with a {type(reducer.stepper.optimizer).__name__}); call it once"
            )
        reducer.stepper = BucketStepper(optimizer, reducer.buckets, reducer.params)

    @property
    def buckets(self) -> list:
        """The reducer's buckets (empty when no reducer runs, e.g. at world size 1)."""
        return [] if self._reducer is None else self._reducer.buckets

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the module. Decides whether this forward's backward synchronizes (as torch's DDP).

        With broadcast_buffers every rank first receives rank 0's buffers (a
        collective: all ranks call forward the same number of times).
        """
        if not self._forwarded:
            self._forwarded = True
        if self._reducer is not None and torch.is_grad_enabled():
            if self._reducer.in_backward and not _inside_backward():
                # The last backward raised outside the reducer (a user hook, out of memory,
                # Ctrl-C) and autograd dropped its end-of-backward callback: start clean.
                self._reducer.abandon()
            self._reducer.sync = self.require_backward_grad_sync
            if self.gradient_as_bucket_view:
                self._reducer.restore_views()
        if self._buffers_to_sync:
            broadcast_coalesced(self._buffers_to_sync)
        if self._input_device is not None:
            args, kwargs = _to_device(args, self._input_device), _to_device(kwargs, self._input_device)
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Forwards inside make their backward accumulate locally (torch's semantics).

        The next synchronized backward reduces the accumulated sum. What
        decides is where the *forward* ran: a forward inside with its backward
        outside does not synchronize either.
        """
        previous, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    # -- hooks for the strategy that steps (`clorch.strategies.DDPStrategy`, through its precision
    # object): what the wrapper holds, and where a step starts and ends. The wrapper never steps.

    def begin_step(self) -> None:
        """Mark the start of an optimizer step. Local.

        Raises:
            ValueError: no synchronized backward since the last `end_step` (every one ran under
                `no_sync()`): `.grad` holds this rank's sum alone.
        """
        if self._reducer is not None and not self._reducer.committed:
            raise ValueError(
                "DistributedDataParallel: no synchronized backward since the last step (every "
                "forward ran under no_sync() or with require_backward_grad_sync=False?); run the "
                "last micro-batch's forward and backward outside no_sync()"
            )

    def end_step(self) -> None:
        """Mark the end of an optimizer step: the next one needs a new synchronized backward.
        Local; a strategy calls it after stepping (and zeroes the gradients itself)."""
        if self._reducer is not None:
            self._reducer.committed = False

    def flat_gradients(self, optimizer: torch.optim.Optimizer) -> list[torch.Tensor] | None:
        """The flat bucket buffers every gradient of `optimizer` views, or None: the optimizer
        holds other parameters than the reducer's, or there is no reducer (one rank). A loss
        scaler unscales these few buffers instead of each gradient
        (`MixedPrecision.optimizer_step(optimizer, flats=...)`). Local."""
        if self._reducer is not None and self._optimizer_covers(optimizer):
            return [bucket.flat for bucket in self._reducer.buckets]
        return None

    @property
    def optimizer_in_backward(self) -> torch.optim.Optimizer | None:
        """The optimizer that backward steps (`step_in_backward`), or None. Its step is then
        taken already when a synchronized backward returns: a strategy only zeroes the gradients."""
        stepper = None if self._reducer is None else self._reducer.stepper
        return None if stepper is None else stepper.optimizer

    def reduce_gradients(self) -> None:
        """Make sure `.grad` holds the average (kept for older code: the synchronized backward
        did it when it ended). Local."""
        if self._reducer is not None:
            self._reducer.finish()

    def _optimizer_covers(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether `optimizer` holds exactly the reducer's parameters (cached per optimizer)."""
        key = (id(optimizer), sum(len(group["params"]) for group in optimizer.param_groups))
        covers = self._covers.get(key)
        if covers is None:
            ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
            covers = self._covers[key] = ids == self._reducer.param_ids
        return covers

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Load a state dict with this module's keys (`module.`-prefixed, as torch's DDP) or the model's.

        `state_dict()` returns torch DDP's keys (`module.` + the model's keys),
        matching `named_parameters()`, so torch DDP checkpoints load as they
        are; a state dict of the unwrapped model (what clorch's checkpoints
        and `model.module.state_dict()` hold) loads too.
        """
        if isinstance(state_dict, dict) and set(state_dict) <= set(self.module.state_dict()):
            return self.module.load_state_dict(state_dict, strict=strict, assign=assign)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def close(self) -> None:
        """Remove every hook (local; waits for reductions still in flight)."""
        if self._reducer is not None:
            self._reducer.remove()
            self._reducer = None

    def __enter__(self) -> "DistributedDataParallel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside clorch's or torch's DistributedDataParallel (the model itself otherwise)."""
    if isinstance(model, (DistributedDataParallel, nn.parallel.DistributedDataParallel)):
        return model.module
    return model


@contextlib.contextmanager
def no_sync(model: DistributedDataParallel) -> Iterator[None]:
    """Function form of `model.no_sync()`."""
    if not isinstance(model, DistributedDataParallel):
        raise TypeError(f"no_sync() takes a clorch DistributedDataParallel, got {type(model).__name__}")
    with model.no_sync():
        yield
