"""What clorch's DistributedDataParallel takes from torch's class, and what it refuses.

clorch's DDP subclasses `torch.nn.parallel.DistributedDataParallel` so that
`isinstance(model, torch.nn.parallel.DistributedDataParallel)` holds (unwrap
helpers, `torch.distributed.checkpoint`), but it never runs torch's
`__init__`: there is no torch reducer, logger or join state. Every method of
torch's class that clorch does not define itself and that would reach those is
replaced by one that raises `NotImplementedError` naming the method, so a call
fails at once instead of deep inside torch.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
from torch import nn

from clorch.distributed.groups import is_initialized
from clorch.nn.parallel.comm_hooks import HookReducer, check_comm_hook

TORCH_DDP = nn.parallel.DistributedDataParallel

# Members of torch's class that work as they are on clorch's DDP (they read only
# `module`, `dim` or the default group, or are torch's own class-level helpers).
HARMLESS = frozenset(
    {
        "train",
        "scatter",
        "gather",
        "_get_active_ddp_module",
        "_get_data_parallel_params",
        "_set_params_and_buffers_to_ignore_for_model",
        "_distributed_rank",
    }
)

_HINTS = {
    "join": "every rank must run the same number of synchronized backwards (give every rank as "
    "many batches: clorch.data.DistributedSampler pads, or drop_last=True)",
    "join_hook": "see join",
    "join_device": "see join",
    "join_process_group": "see join",
    "_register_builtin_comm_hook": "use register_comm_hook(None, default_hooks.fp16_compress_hook) (or allreduce_hook)",
    "_register_fused_optim": "use step_in_backward(optimizer)",
    "_update_process_group": "clorch reduces over the default process group",
}


def _refusal(name: str, is_property: bool) -> Any:
    hint = _HINTS.get(name, "clorch's DDP runs its own bucketed reducer (clorch.nn.parallel.reducer)")
    message = (
        f"DistributedDataParallel.{name} belongs to torch's DDP internals (its C++ reducer, "
        f"logger or join state), which clorch's DistributedDataParallel does not have: {hint}"
    )

    def refuse(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(message)

    refuse.__name__ = refuse.__qualname__ = name
    refuse.__doc__ = f"Not supported by clorch's DistributedDataParallel: {hint}."
    return property(refuse) if is_property else refuse


def refuse_torch_internals(cls: type) -> type:
    """Class decorator: every member of torch's DDP that `cls` does not define and that is not
    `HARMLESS` raises NotImplementedError (checked against the installed torch at import)."""
    for name, member in vars(TORCH_DDP).items():
        if any(name in vars(klass) for klass in cls.__mro__[: cls.__mro__.index(TORCH_DDP)]) or name in HARMLESS:
            continue
        if name.startswith("__") and name not in ("__getstate__", "__setstate__"):
            continue
        if isinstance(member, property):
            setattr(cls, name, _refusal(name, is_property=True))
        elif callable(member) or isinstance(member, (staticmethod, classmethod)):
            setattr(cls, name, _refusal(name, is_property=False))
    return cls


class TorchDDPInterface(TORCH_DDP):
    """torch's DDP methods and attributes as clorch's DistributedDataParallel implements them.

    The base of `clorch.nn.parallel.DistributedDataParallel`, which builds the
    reducer (`_build_reducer`) and sets `_reducer`, `_reducer_args`,
    `_input_device`, `overlap_grad_copies` and `_forwarded`.
    """

    def _set_torch_attributes(self, process_group: Any, dim: int, cap_mb: float, cap_default: bool) -> None:
        """The public attributes torch's DDP has, with the values torch's would hold."""
        device = self._input_device
        self.device_ids = None if device is None else [device.index]
        self.output_device = None if device is None else device.index
        first = next(self.module.parameters(), None)
        self.device = first.device if first is not None else torch.device("cpu")
        self.device_type = self.device.type
        self.dim = dim
        self.process_group = (
            process_group
            if process_group is not None
            else (torch.distributed.group.WORLD if is_initialized() else None)
        )
        self.find_unused_parameters = False  # True is refused by check_unsupported
        self.mixed_precision = None
        self.bucket_bytes_cap = int(cap_mb * 1024 * 1024)
        self.bucket_bytes_cap_default = cap_default
        self.require_forward_param_sync = True

    @property
    def broadcast_buffers(self) -> bool:
        """Whether each forward first broadcasts rank 0's buffers (settable, as in torch)."""
        return self.forward_sync_buffers

    @broadcast_buffers.setter
    def broadcast_buffers(self, value: bool) -> None:
        self.forward_sync_buffers = bool(value)
        sync = self.forward_sync_buffers and self._reducer_args[3] > 1
        self._buffers_to_sync = list(self.module.buffers()) if sync else []

    def register_comm_hook(self, state: object, hook: Callable) -> None:
        """Let `hook` communicate each bucket instead of clorch's all-reduce (torch's signature).

        Accepts torch's elementwise hooks, `allreduce_hook`, `fp16_compress_hook`
        and `bf16_compress_hook` from
        `torch.distributed.algorithms.ddp_comm_hooks.default_hooks` (`state` is
        their process group, None for the default one); the gradients equal
        torch's DDP with the same hook. The hook gets torch's `GradBucket`
        interface over clorch's buckets (see `clorch.nn.parallel.comm_hooks`),
        and runs at every world size inside a group (at world size 1 too, as
        in torch). Local, but every rank must register the same hook before
        its first forward.

        Raises:
            TypeError: hook is not callable.
            ValueError: a hook other than those, or one combined with
                reduce_dtype, overlap_grad_copies or step_in_backward.
            RuntimeError: a hook is already registered, a forward already
                ran, or no process group is initialized (the hook all-reduces
                over one).
        """
        check_comm_hook(hook)
        if isinstance(self._reducer, HookReducer):
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")
        if self._forwarded:
            raise RuntimeError(
                "register_comm_hook must be called before the first forward (each bucket's reduction is set up then)"
            )
        if not is_initialized():
            raise RuntimeError(
                "register_comm_hook needs an initialized process group (the hook "
                "all-reduces over it): call clorch.distributed.init_process_group() first"
            )
        conflicts = [
            name
            for name, on in (
                ("reduce_dtype", self._reducer_args[2] is not None),
                ("overlap_grad_copies", self.overlap_grad_copies),
                ("step_in_backward", self._reducer is not None and self._reducer.stepper is not None),
            )
            if on
        ]
        if conflicts:
            raise ValueError(
                f"register_comm_hook cannot be combined with {', '.join(conflicts)}: "
                "the hook decides what travels and completes each bucket"
            )
        if self._reducer is not None:
            self._reducer.remove()
        self._reducer = self._build_reducer(comm_hook=(hook, state))

    def _set_static_graph(self) -> None:
        """Record `static_graph = True` (torch's API); clorch's reducer needs nothing else. Local."""
        if self.static_graph:
            warnings.warn("You've set static_graph to be True, no need to set it again.", stacklevel=2)
            return
        self.static_graph = True

    def will_sync_module_buffers(self) -> bool:
        """Whether each forward broadcasts rank 0's buffers (False at world size 1)."""
        return self.require_forward_param_sync and bool(self._buffers_to_sync)

    def _get_ddp_logging_data(self) -> dict[str, Any]:
        """torch's debugging summary, the keys clorch can fill (plus "reducer": "clorch"). Local."""
        return logging_data(self)

    def _check_reducer_finalized(self) -> None:
        """Raise RuntimeError if a synchronized backward started and did not finish. Local."""
        if self._reducer is not None and self._reducer.in_backward:
            raise RuntimeError(
                "DistributedDataParallel: the last synchronized backward did not finish "
                "(it raised, or was abandoned before its end)"
            )

    def _remove_autograd_hooks(self) -> None:
        """torch's name for `close()`: remove the reducer's hooks (local)."""
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        """State for pickle and copy.deepcopy: the reducer is rebuilt on load, the group re-read.

        Raises:
            TypeError: step_in_backward was called (the optimizer it steps is not part of the model).
        """
        reducer = self._reducer
        if reducer is not None and reducer.stepper is not None:
            raise TypeError(
                "a DistributedDataParallel with step_in_backward() cannot be pickled or "
                "copied; copy ddp.module (or its state_dict()) instead"
            )
        state = nn.Module.__getstate__(self)
        state["_reducer"] = (
            None
            if reducer is None
            else (("hook", reducer.hook, reducer.state) if isinstance(reducer, HookReducer) else ("plain",))
        )
        state["_covers"] = {}
        state["process_group"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore from `__getstate__`: the same reducer over the loaded parameters (no collective)."""
        kind = state.pop("_reducer")
        nn.Module.__setstate__(self, state)  # not torch's: that builds torch's reducer
        self._reducer = None
        self.process_group = torch.distributed.group.WORLD if is_initialized() else None
        if kind is not None:
            self._reducer = self._build_reducer(comm_hook=kind[1:] if kind[0] == "hook" else None)


def logging_data(ddp: Any) -> dict[str, Any]:
    """A subset of the keys of torch's `_get_ddp_logging_data()`, from clorch's DDP (local)."""
    params = [p for p in ddp.module.parameters() if p.requires_grad]
    reducer = ddp._reducer
    hook = getattr(reducer, "hook", None)
    return {
        "module_name": type(ddp.module).__name__,
        "world_size": ddp._reducer_args[3],
        "rank": torch.distributed.get_rank() if torch.distributed.is_initialized() else 0,
        "backend_name": str(torch.distributed.get_backend()) if torch.distributed.is_initialized() else "",
        "device_ids": "" if ddp.device_ids is None else ", ".join(str(i) for i in ddp.device_ids),
        "output_device": -1 if ddp.output_device is None else ddp.output_device,
        "broadcast_buffers": int(ddp.broadcast_buffers),
        "bucket_cap_bytes": ddp.bucket_bytes_cap,
        "find_unused_parameters": int(ddp.find_unused_parameters),
        "gradient_as_bucket_view": int(ddp.gradient_as_bucket_view),
        "static_graph": int(ddp.static_graph),
        "comm_hook": "" if hook is None else hook.__qualname__,
        "num_parameter_tensors": len(params),
        "total_parameter_size_bytes": sum(p.numel() * p.element_size() for p in params),
        "dtypes": ", ".join(sorted({str(p.dtype).replace("torch.", "") for p in params})),
        "bucket_sizes": ", ".join(str(b.flat.numel() * b.flat.element_size()) for b in ddp.buckets),
        "is_multi_device_module": int(len({p.device for p in params}) > 1),
        "reducer": "clorch",
    }
