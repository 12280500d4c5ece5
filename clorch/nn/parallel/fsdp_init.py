"""Giving a model built on the meta device its storage and its first values, one piece at a time.

Under `parallel=fsdp` no rank may hold the whole model: the model is built
on the meta device (shapes only), sharded (`shard_model`), and then its
shards get storage and values here:

* `materialize`: seeded values that depend on the seed and each module's name
  only, never on the sharding (see its docstring): the built-in models start
  from them under `ddp` and `fsdp` alike.
* `allocate` then `clorch.checkpoint.weights.load_weights`: values read from
  a file tensor by tensor (`model.init_from`), each rank keeping its slice.
* `parameters_on_meta`: build a model of your own with its parameters on the
  meta device and its buffers real, so that buffers its `__init__` computes
  (a causal mask, rotary frequencies) survive.

Everything here is local (no collective): every rank draws or reads the same
full values and keeps its own slice (`fill_shard`).
"""

from __future__ import annotations

import contextlib
import warnings
import zlib
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, distribute_tensor

__all__ = ["INIT_MODULE", "allocate", "fill_shard", "gpt_init_fn", "init_fn_of", "materialize", "parameters_on_meta"]


def _class_name(module: nn.Module) -> str:
    """The module's own class name; a sharded module's class is FSDP's subclass `FSDP<name>` of it."""
    cls = type(module)
    if isinstance(module, FSDPModule):
        cls = next(c for c in cls.__mro__[1:] if c is not FSDPModule and not issubclass(c, FSDPModule))
    return cls.__name__


INIT_MODULE = "init_module"
"""The method a model defines to initialize one of its modules (`materialize`'s `init_fn`):
`model.init_module(module)` draws that module's own parameters (the built-in GPT: GPT-2's
N(0, 0.02), scaled residual projections)."""


def init_fn_of(model: nn.Module) -> Callable[[nn.Module], None] | None:
    """The model's per-module initializer, its `init_module` method; None where it has none:
    `materialize` then uses each module's `reset_parameters` only."""
    init = getattr(model, INIT_MODULE, None)
    return init if callable(init) else None


gpt_init_fn = init_fn_of  # the name under which the built-in GPT's initializer was first read


def _module_seed(seed: int, name: str) -> int:
    return (seed + zlib.crc32(name.encode())) % (2**63)


def fill_shard(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy a full-size value into a parameter or buffer: this rank's slice of it when sharded.

    `full` may be on the CPU and of another dtype; for a sharded parameter torch's
    `distribute_tensor` moves the whole tensor to the parameter's device before keeping this
    rank's slice, so for a moment the device holds that one tensor whole. Local.
    """
    with torch.no_grad():
        if isinstance(param, DTensor):
            # src_data_rank=None: every rank slices its own shard, nothing is sent.
            local = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
            param.to_local().copy_(local.to_local())
        else:
            param.copy_(full)


def materialize(
    model: nn.Module, device: str | torch.device, *, seed: int = 0, init_fn: Callable[[nn.Module], None] | None = None
) -> nn.Module:
    """Give a meta (or empty) model real storage on `device` and seeded initial values.

    See the module docstring for the rule that makes the values independent of
    sharding. The global RNG state is left as it was.

    Args:
        device: where the (sharded) parameters live.
        seed: the run's seed.
        init_fn: called on each module after its `reset_parameters` (e.g. `init_fn_of(model)`).

    Local: no collective.

    Raises:
        ValueError: without `init_fn`, a module owns parameters but has no `reset_parameters`
            (they would keep `to_empty`'s garbage); names the modules.

    Warns:
        UserWarning: a module without `reset_parameters` holds buffers, which `to_empty`
            leaves uninitialized: fill them yourself.
    """
    _check_initializable(model, init_fn)
    ties = _shared_parameters(model)
    model.to_empty(device=device)
    _retie(ties)
    for name, module in model.named_modules():
        own = dict(module.named_parameters(recurse=False))
        if not own or not (hasattr(module, "reset_parameters") or init_fn is not None):
            continue
        full = {n: nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="cpu")) for n, p in own.items()}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(_module_seed(seed, name))
            _with_parameters(module, full, init_fn)
        for n, p in own.items():
            fill_shard(p, full[n].detach())
    return model


def _check_initializable(model: nn.Module, init_fn: Callable[[nn.Module], None] | None) -> None:
    bare, buffers = [], []
    for name, module in model.named_modules():
        if hasattr(module, "reset_parameters"):
            continue
        if init_fn is None and any(True for _ in module.parameters(recurse=False)):
            bare.append(f"{name or '(root)'} ({_class_name(module)})")
        if any(True for _ in module.buffers(recurse=False)):
            buffers.append(f"{name or '(root)'} ({_class_name(module)})")
    if bare:
        raise ValueError(
            f"materialize cannot initialize the parameters of {bare}: they have no "
            "reset_parameters(); pass init_fn=, a function of a module that fills its parameters"
        )
    if buffers:
        warnings.warn(
            f"materialize leaves the buffers of {buffers} uninitialized (no reset_parameters()); "
            "fill them after materialize",
            stacklevel=3,
        )


def _shared_parameters(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """Every parameter held by several modules (tied weights), as its (module, name) places."""
    places: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                places.setdefault(id(param), []).append((module, name))
    return [group for group in places.values() if len(group) > 1]


def _retie(ties: list[list[tuple[nn.Module, str]]]) -> None:
    # `to_empty` gives each module a new tensor of its own, so an unsharded model's tied
    # weights come apart (fully_shard keeps them tied); tie them again as they were.
    for (first, first_name), *others in ties:
        for module, name in others:
            if module._parameters[name] is not first._parameters[first_name]:
                module._parameters[name] = first._parameters[first_name]


def _with_parameters(
    module: nn.Module, full: dict[str, nn.Parameter], init_fn: Callable[[nn.Module], None] | None
) -> None:
    """Run the module's initializers on full-size CPU stand-ins for its parameters."""
    saved = {n: module._parameters[n] for n in full}
    try:
        module._parameters.update(full)
        with torch.no_grad():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
            if init_fn is not None:
                init_fn(module)
    finally:
        module._parameters.update(saved)


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Inside it, every parameter a module registers moves to the meta device at once; buffers stay.

    For building a model of your own without its weights: each parameter
    exists in host memory only between its creation and its registration
    (one at a time), and whatever `__init__` then does to it (its own
    initialization) acts on the meta device, i.e. not at all. Buffers keep
    the values `__init__` computed (a causal mask, rotary frequencies, which
    no weights file may hold). Accelerate's `init_empty_weights` does the same.

    Not thread-safe: it replaces `nn.Module.register_parameter` while it runs
    (and restores it on exit, also on an error). Local.
    """
    register = nn.Module.register_parameter

    def register_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:
            param = type(param)(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = register_on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def allocate(model: nn.Module, device: str | torch.device) -> nn.Module:
    """Give every meta parameter and buffer of `model` storage on `device`, values unset.

    Like `model.to_empty(device=...)`, but buffers that already hold values (those
    `parameters_on_meta` kept) keep them, moved to `device`, and tied weights stay
    tied. Fill the parameters afterwards (`load_weights`, or `materialize` instead
    of this). Local.
    """
    kept = {
        name: buffer.detach().clone()
        for name, buffer in model.named_buffers(remove_duplicate=False)
        if not buffer.is_meta
    }
    ties = _shared_parameters(model)
    model.to_empty(device=device)
    _retie(ties)
    with torch.no_grad():
        for name, buffer in model.named_buffers(remove_duplicate=False):
            if name in kept:
                buffer.copy_(kept[name])
    return model
