"""Checks of torch's DistributedDataParallel arguments that clorch's DDP accepts or refuses."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from clorch.precision import DTYPE_NAMES, torch_dtype

_UNSUPPORTED_DEFAULTS = {
    "find_unused_parameters": False,
    "delay_all_reduce_named_params": None,
    "param_to_hook_all_reduce": None,
    "mixed_precision": None,
    "device_mesh": None,
    "skip_all_reduce_unused_params": False,
    "bucket_cap_mb_list": None,
    "batched_grad_copy": False,
    "forward_sync_buffers": None,
}
_HINTS = {
    "find_unused_parameters": "every trainable parameter must receive a gradient in each "
    "synchronized backward (set requires_grad=False on unused ones)",
    "mixed_precision": "use reduce_dtype= for the buckets and clorch.amp.autocast for compute",
    "device_mesh": "clorch reduces over the whole job (the default process group)",
}


def check_unsupported(**options: Any) -> None:
    """ValueError for a torch DDP option clorch does not implement, set to a non-default value."""
    for name, value in options.items():
        if name not in _UNSUPPORTED_DEFAULTS:
            raise TypeError(f"DistributedDataParallel got an unexpected keyword argument {name!r}")
        default = _UNSUPPORTED_DEFAULTS[name]
        if value is not default and value != default:
            hint = _HINTS.get(name, "leave it at its default")
            raise ValueError(
                f"{name}={value!r} is unsupported by clorch's DistributedDataParallel (allowed: {default!r}): {hint}"
            )


def check_process_group(process_group: Any) -> None:
    """Only the default group (or None) is accepted: clorch's reducer spans the whole job."""
    if process_group is None:
        return
    default = dist.distributed_c10d._get_default_group() if dist.is_initialized() else None
    if process_group is default or process_group is dist.group.WORLD:
        return
    raise ValueError(
        f"process_group must be None or the default process group, got {process_group!r}: "
        "clorch's DistributedDataParallel reduces over every rank of the job"
    )


def _as_device(name: str, value: Any) -> torch.device:
    try:
        device = (
            torch.device("cuda", value)
            if isinstance(value, int) and not isinstance(value, bool)
            else torch.device(value)
        )
    except (TypeError, RuntimeError, ValueError):
        raise ValueError(
            f"{name} must name a device (an int index, 'cuda:N' or a torch.device), got {value!r}"
        ) from None
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _module_device(module: nn.Module) -> torch.device | None:
    devices = {p.device for p in module.parameters()} | {b.device for b in module.buffers()}
    return next(iter(devices)) if len(devices) == 1 else None


def check_device_ids(module: nn.Module, device_ids: Any, output_device: Any) -> torch.device | None:
    """The device that `device_ids` names (None without it); it must be where the module is.

    Raises:
        ValueError: more than one device, a device other than the module's
            (torch's rule: single-device modules only; CPU modules take None),
            or an output_device other than that device.
    """
    if device_ids is None:
        if output_device is not None:
            raise ValueError(f"output_device={output_device!r} needs device_ids naming the same device")
        return None
    if not isinstance(device_ids, (list, tuple)) or len(device_ids) != 1:
        raise ValueError(f"device_ids must be None or a list of one device (this rank's), got {device_ids!r}")
    device = _as_device("device_ids[0]", device_ids[0])
    where = _module_device(module)
    if where is not None and where.type == "cpu":
        raise ValueError(f"device_ids must be None for a module on the CPU, got {device_ids!r}")
    if where is not None and where != device:
        raise ValueError(
            f"device_ids={device_ids!r} names {device}, but the module is on {where}: "
            "move the module to this rank's device first (model.to(device_ids[0]))"
        )
    if output_device is not None and _as_device("output_device", output_device) != device:
        raise ValueError(f"output_device={output_device!r} must be the device of device_ids ({device})")
    return device


def resolve_reduce_dtype(value: object) -> torch.dtype | None:
    """The dtype buckets travel in, for `DistributedDataParallel(reduce_dtype=value)`.

    Buckets whose gradients already have the dtype travel as they are (fp32
    over fp32 gradients is the same as None). fp16 is safe for the sum because
    every rank divides by world_size before the all-reduce.

    Args:
        value: None (the gradients' own dtype), a name of
            `clorch.precision.DTYPE_NAMES` ("fp32", "bf16", "fp16" or an alias)
            or a floating torch dtype.

    Raises:
        ValueError: anything else.
    """
    if value is None or (isinstance(value, torch.dtype) and value.is_floating_point):
        return value  # type: ignore[return-value]
    if isinstance(value, str) and value in DTYPE_NAMES:
        return torch_dtype(value)
    names = ", ".join(repr(name) for name in DTYPE_NAMES)
    raise ValueError(
        f"reduce_dtype must be None, one of {names} or a floating torch dtype (e.g. torch.bfloat16), got {value!r}"
    )


def check_cap(name: str, value: object) -> None:
    """A bucket cap: a finite number of MiB > 0 (ValueError naming `name` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0 (MiB), got {value!r}")


def check_arguments(module: object, process_group: Any, overlap_grad_copies: object, unsupported: dict) -> None:
    """The arguments torch's DDP takes that clorch's checks before anything is set (see the class)."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    check_unsupported(**unsupported)
    check_process_group(process_group)
    if not isinstance(overlap_grad_copies, bool):
        raise TypeError(f"overlap_grad_copies must be a bool, got {overlap_grad_copies!r}")
