"""Sharded data parallelism on torch's own FSDP2 (`torch.distributed.fsdp.fully_shard`).

Parameters, gradients and optimizer state are split across the ranks of a
`DeviceMesh`; each rank holds about 1/world of them. The usual sequence:

    model = build_on_meta()                 # e.g. `with torch.device("meta"): GPT(config)`
    shard_model(model, shard_modules="auto", precision="bf16")
    materialize(model, device, seed=0, init_fn=init_fn_of(model))
    optimizer = torch.optim.AdamW(model.parameters())   # built after sharding: state is sharded too

Seeded start and weights from a file: `clorch.nn.parallel.fsdp_init` (`materialize`,
`allocate`, `parameters_on_meta`, re-exported here) and
`clorch.checkpoint.weights.load_weights`, which reads a file tensor by tensor into
the shards.

Collectives: `shard_model` (through `fully_shard`) and every forward and
backward of a sharded model are collective over the mesh: every rank calls
them in the same order; a rank that does not leaves the others blocked until
the process group's timeout, which then raises on them. `materialize` and
`apply_activation_checkpointing` are local. `clip_grad_norm_` all-reduces the
norm over the mesh when the gradients are sharded.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

import clorch.distributed as cdist
from clorch._args import int_arg as _int_arg
from clorch.nn.parallel.fsdp_init import _class_name, allocate, gpt_init_fn, init_fn_of, materialize, parameters_on_meta
from clorch.precision import get_precision

__all__ = [
    "AUTO_MIN_PARAMS",
    "ShardedTrainer",
    "allocate",
    "apply_activation_checkpointing",
    "clip_grad_norm_",
    "device_mesh",
    "gpt_init_fn",
    "init_fn_of",
    "materialize",
    "mixed_precision_policy",
    "parameters_on_meta",
    "shard_model",
    "sharded_modules",
]

AUTO_MIN_PARAMS = 1_000_000
"""`shard_modules="auto"`: a child module with at least this many parameters gets its own fully_shard."""

SHARD_UNITS = "shard_units"
"""The method a model defines to name its shard units (`shard_modules="auto"`): `model.shard_units()`
returns the submodules that each get their own fully_shard (the built-in GPT: its blocks)."""


def device_mesh(device_type: str | None = None) -> DeviceMesh:
    """A 1-D mesh of every rank of the default process group.

    Args:
        device_type: "cpu" or "cuda"; default: "cuda" for an nccl group, else "cpu".

    Collective: every rank must call it. Raises RuntimeError outside a process group.
    """
    if not cdist.is_initialized():
        raise RuntimeError(
            "device_mesh needs an initialized process group "
            "(clorch.distributed.process_group() or torch.distributed.init_process_group)"
        )
    if device_type is None:
        device_type = "cuda" if cdist.backend() == "nccl" else "cpu"
    return init_device_mesh(device_type, (cdist.world_size(),))


def mixed_precision_policy(precision: str = "fp32", reduce_dtype: str = "fp32") -> MixedPrecisionPolicy | None:
    """FSDP2's policy for a clorch precision name: compute in it, reduce gradients in `reduce_dtype`.

    "fp32" with an fp32 reduce gives None (no casts); with reduce_dtype="bf16" only the
    gradients are reduced in bf16 (half the bytes on the wire). "bf16" keeps fp32 sharded parameters, all-gathers
    and computes in bf16, and reduce-scatters gradients in fp32 (the default
    `reduce_dtype`), so summing many ranks' gradients loses no bits to bf16.
    "fp16" likewise, in fp16: it needs a loss scaler that sees sharded gradients
    (`clorch.amp.GradScaler`, which the strategy's precision object drives, or torch's
    `ShardedGradScaler`);
    this policy only sets the dtypes.

    Raises:
        TypeError / ValueError: an unknown precision name (see `clorch.precision`).
    """
    compute, reduce = get_precision(precision), get_precision(reduce_dtype)
    if not compute.autocast and not reduce.autocast:
        return None
    return MixedPrecisionPolicy(
        param_dtype=compute.torch_dtype() if compute.autocast else None, reduce_dtype=reduce.torch_dtype()
    )


def _parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def sharded_modules(
    model: nn.Module, shard_modules: str | Sequence[str] = "auto", min_params: int = AUTO_MIN_PARAMS
) -> list[nn.Module]:
    """The submodules that get their own `fully_shard` (never the root, which `shard_model` adds).

    Args:
        shard_modules: "auto": the modules the model names with its `shard_units()` method
            (the built-in GPT: its blocks; a model of yours may define one too), else every
            descendant with >= `min_params` parameters whose parent is not chosen already
            (top-down, so a large block is one unit, not its layers); or a list of class
            names (`["Block"]`): every module of those classes.
        min_params: the "auto" threshold (parameters, counted on meta tensors too).

    Raises:
        TypeError: shard_modules is neither "auto" nor a list of str.
        ValueError: min_params < 1, or a named class occurs nowhere in the model (names the classes present).
    """
    _int_arg("min_params", min_params, 1)
    if shard_modules == "auto":
        declared = getattr(model, SHARD_UNITS, None)
        if callable(declared):
            return _declared_units(model, declared())
        chosen: list[nn.Module] = []
        _auto_collect(model, min_params, chosen)
        return chosen
    if isinstance(shard_modules, str) or not all(isinstance(n, str) for n in shard_modules):
        raise TypeError(f"shard_modules must be 'auto' or a list of class names, got {shard_modules!r}")
    present = {_class_name(m) for m in model.modules()}
    missing = [n for n in shard_modules if n not in present]
    if missing:
        raise ValueError(
            f"shard_modules names classes that are not in the model: {missing}; the model has {sorted(present)}"
        )
    wanted = set(shard_modules)
    return [m for m in model.modules() if m is not model and _class_name(m) in wanted]


def _declared_units(model: nn.Module, units: Any) -> list[nn.Module]:
    """The units a model's `shard_units()` returned, checked: submodules of the model, not the root.

    Raises:
        TypeError: it returned something other than submodules of the model.
    """
    inside = {id(m) for m in model.modules() if m is not model}
    units = list(units)
    if not all(isinstance(u, nn.Module) and id(u) in inside for u in units):
        raise TypeError(
            f"{type(model).__name__}.{SHARD_UNITS}() must return submodules of the model (never the model "
            f"itself), got {[type(u).__name__ for u in units]}"
        )
    return units


def _auto_collect(module: nn.Module, min_params: int, chosen: list[nn.Module]) -> None:
    for child in module.children():
        if _parameter_count(child) >= min_params and not isinstance(
            child, (nn.ModuleList, nn.ModuleDict, nn.Sequential)
        ):
            chosen.append(child)
        else:
            _auto_collect(child, min_params, chosen)


def shard_model(
    model: nn.Module,
    *,
    mesh: DeviceMesh | None = None,
    shard_modules: str | Sequence[str] = "auto",
    min_params: int = AUTO_MIN_PARAMS,
    reshard_after_forward: bool = True,
    precision: str = "fp32",
    reduce_dtype: str = "fp32",
    cpu_offload: bool = False,
    policy: MixedPrecisionPolicy | None | str = "from names",
) -> nn.Module:
    """Apply `fully_shard` to the chosen submodules, then to the root; return the same model.

    Works on a model on the meta device (then call `materialize`) or on real tensors.
    Apply `apply_activation_checkpointing` before this, as torch advises.

    Args:
        mesh: the ranks to shard over; default: every rank (`device_mesh()`: CUDA under nccl).
        shard_modules, min_params: which submodules are a unit of their own (`sharded_modules`).
        reshard_after_forward: free the gathered parameters after each unit's forward and
            gather them again for backward (less memory, one more all-gather per unit).
            The root never reshards after forward: its backward starts at once.
        precision, reduce_dtype: clorch precision names (`mixed_precision_policy`).
        policy: FSDP2's MixedPrecisionPolicy itself, or None (no casts), in place of
            `precision` and `reduce_dtype` (`clorch.amp.MixedPrecision.fsdp_policy()` gives it).
        cpu_offload: keep sharded parameters, gradients and optimizer state in CPU memory
            (pinned), copied to the device per unit; build the optimizer after sharding.

    Collective: every rank of the mesh must call it with the same model.

    Raises:
        TypeError: reshard_after_forward or cpu_offload is not a bool.
        ValueError: see `sharded_modules` and `mixed_precision_policy`.
    """
    for name, value in (("reshard_after_forward", reshard_after_forward), ("cpu_offload", cpu_offload)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {value!r}")
    if mesh is None:
        mesh = device_mesh()
    kwargs: dict[str, Any] = {"mesh": mesh}
    if isinstance(policy, str):
        policy = mixed_precision_policy(precision, reduce_dtype)
    if policy is not None:
        kwargs["mp_policy"] = policy
    # Pinned memory exists only with CUDA; a CPU-only job offloads to where it already is.
    kwargs["offload_policy"] = (
        CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if cpu_offload else OffloadPolicy()
    )
    for module in sharded_modules(model, shard_modules, min_params):
        fully_shard(module, reshard_after_forward=reshard_after_forward, **kwargs)
    fully_shard(model, reshard_after_forward=False, **kwargs)
    return model


def _checkpointed_forward(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    # Non-reentrant: works with keyword arguments, with DDP's gradient hooks and with
    # FSDP2's pre-backward all-gather (the recomputation runs inside the unit's backward).
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def apply_activation_checkpointing(model: nn.Module, module_classes: str | Sequence[str] = "auto") -> int:
    """Recompute the chosen modules' activations in backward instead of storing them.

    Replaces each chosen module's `forward` on the instance, so parameter names,
    state dicts and class names stay as they were; works under clorch's DDP,
    torch's DDP and `shard_model` (apply it before `shard_model`).

    Args:
        module_classes: class names, or "auto": the modules the model's `shard_units()`
            names (the built-in GPT's blocks), else no module (ValueError: name them).

    Returns:
        How many modules now checkpoint.

    Raises:
        ValueError: "auto" on a model without `shard_units()`, or a named class not in the model.
    """
    if module_classes == "auto":
        declared = getattr(model, SHARD_UNITS, None)
        if not callable(declared):
            raise ValueError(
                f"apply_activation_checkpointing(module_classes='auto') takes the modules a model names "
                f"with its {SHARD_UNITS}() method, and {type(model).__name__} has none; name your "
                "model's block classes, e.g. ['Block'], or give the model that method"
            )
        chosen = _declared_units(model, declared())
    else:
        chosen = sharded_modules(model, module_classes)
    for module in chosen:
        module.forward = functools.partial(_checkpointed_forward, module.forward)
    return len(chosen)


def clip_grad_norm_(
    parameters: Iterable[torch.Tensor] | nn.Module, max_norm: float, norm_type: float = 2.0
) -> torch.Tensor:
    """torch's `clip_grad_norm_`, on sharded (DTensor) or plain gradients; returns the total norm.

    The norm is that of the whole model's gradient, as in one process. With sharded
    gradients torch all-reduces the partial norms over the mesh (collective: every
    rank calls it); the result is returned as a plain tensor.
    """
    params = list(parameters.parameters() if isinstance(parameters, nn.Module) else parameters)
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


class ShardedTrainer:
    """A sharded model (`shard_model`) as a training loop calls it: forward, `no_sync()`, `parameters()`.

    It only wraps. What steps, unscales and clips is the strategy
    (`clorch.strategies.FSDPStrategy`, or `clorch.strategies.adopt(trainer, ...)` for a loop of
    your own), through its precision object: nothing here drives an optimizer or a scaler.
    `no_sync()` is FSDP2's `set_requires_gradient_sync(False)` (gradients stay
    unsharded-unreduced until the last micro-batch's backward, which reduce-scatters them).

    Collectives: each call (forward) and each synchronized backward are collective over the
    mesh; every rank calls them in the same order.
    """

    sharded = True

    def __init__(self, module: nn.Module, forward: Callable[..., Any] | None = None):
        if not isinstance(module, FSDPModule):
            raise TypeError(f"ShardedTrainer takes a model sharded by shard_model, got {type(module).__name__}")
        self.module = module
        self._forward = module if forward is None else forward  # e.g. torch.compile(module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._forward(*args, **kwargs)

    def parameters(self) -> Iterable[nn.Parameter]:
        return self.module.parameters()

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward inside accumulates local gradients without reducing them (local)."""
        self.module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.module.set_requires_gradient_sync(True)


def sharded_norm_and_clip(parameters: Iterable[torch.Tensor], max_norm: float | None) -> torch.Tensor | None:
    """The total 2-norm of (sharded, unscaled) gradients, clipped to `max_norm` when given; None
    when no parameter has a gradient. Collective over the mesh: the shards' partial norms are
    all-reduced (every rank calls it), and the norm comes back as a plain tensor."""
    params = [p for p in parameters if p.grad is not None]
    if not params:
        return None
    if max_norm is not None:
        return clip_grad_norm_(params, max_norm)
    norm = torch.nn.utils.get_total_norm([p.grad for p in params], 2.0)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm
