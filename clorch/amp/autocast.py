"""Autocast: run the body's eligible ops in a lower precision, restore the thread's state after.

bf16 uses autocast without a scaler; fp16 uses autocast and `GradScaler`;
fp32 uses neither (`clorch.precision` holds these modes; `precision_settings`
returns one's pair).
"""

from __future__ import annotations

import contextlib

import torch

from clorch.precision import DTYPE_NAMES, PRECISIONS, get_precision, torch_dtype

DEVICES = ("cuda", "cpu")
_TORCH_DTYPES = tuple(mode.torch_dtype() for mode in PRECISIONS.values())


def precision_settings(precision: str) -> tuple[torch.dtype | None, bool]:
    """(autocast dtype or None, whether a GradScaler is needed) for a precision name.

    A view of `clorch.precision.get_precision(precision)`: "fp32" gives
    (None, False), "bf16" (torch.bfloat16, False), "fp16" (torch.float16, True);
    the aliases "float32", "bfloat16" and "float16" give the same.

    Raises:
        TypeError: precision is not a str.
        ValueError: precision names no precision mode.
    """
    mode = get_precision(precision)
    return mode.autocast_dtype(), mode.uses_scaler


def _resolve_dtype(dtype: object, device_type: str) -> torch.dtype:
    if dtype is None:
        return torch.get_autocast_dtype(device_type)  # torch's default: fp16 on cuda, bf16 on cpu
    if isinstance(dtype, torch.dtype) and dtype in _TORCH_DTYPES:
        return dtype
    if isinstance(dtype, str) and dtype in DTYPE_NAMES:
        return torch_dtype(dtype)
    torch_names = ", ".join(str(d) for d in _TORCH_DTYPES)
    raise ValueError(f"dtype must be None, {torch_names} or one of {', '.join(DTYPE_NAMES)}, got {dtype!r}")


class autocast(contextlib.ContextDecorator):
    """torch.autocast's interface: run the body's eligible ops in `dtype` on `device_type`.

    On exit, also when the body raises and when nested, the thread's previous
    autocast enabled flag and dtype for the device and the cache setting are
    restored; the cast cache is cleared when the outermost autocast exits.

    Args:
        device_type: "cuda" or "cpu".
        dtype: torch.bfloat16 / torch.float16 (or "bf16", "fp16"); None takes
            torch's default for the device (fp16 on cuda, bf16 on cpu);
            torch.float32 (or "fp32") runs the body in full precision.
        enabled: False runs the body in full precision (still restoring state).
        cache_enabled: cache casts of weights within the outermost region;
            None keeps the thread's current setting (torch's default).

    Raises:
        ValueError: unknown device_type or dtype.
        TypeError: enabled or cache_enabled not a bool.
    """

    def __init__(
        self, device_type: str = "cuda", dtype: object = None, enabled: bool = True, cache_enabled: bool | None = None
    ):
        if device_type not in DEVICES:
            raise ValueError(f"device_type must be one of {', '.join(DEVICES)}, got {device_type!r}")
        for name, value in (("enabled", enabled), ("cache_enabled", cache_enabled)):
            if not isinstance(value, bool) and not (name == "cache_enabled" and value is None):
                raise TypeError(f"{name} must be a bool, got {value!r}")
        self.device = self.device_type = device_type
        self.fast_dtype = self.dtype = _resolve_dtype(dtype, device_type)
        # float32 autocast is no autocast (torch warns and disables it; clorch just disables).
        self.enabled = enabled and self.dtype != torch.float32
        self.cache_enabled = cache_enabled
        self._saved: list[tuple[bool, torch.dtype, bool]] = []

    def __enter__(self) -> "autocast":
        device = self.device
        # A stack, so one instance may be entered again while active.
        self._saved.append(
            (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device), torch.is_autocast_cache_enabled())
        )
        torch.set_autocast_enabled(device, self.enabled)
        if self.dtype != torch.float32:
            torch.set_autocast_dtype(device, self.dtype)
        if self.cache_enabled is not None:
            torch.set_autocast_cache_enabled(self.cache_enabled)
        torch.autocast_increment_nesting()
        return self

    def __exit__(self, *exc: object) -> bool:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        enabled, dtype, cache = self._saved.pop()
        torch.set_autocast_enabled(self.device, enabled)
        torch.set_autocast_dtype(self.device, dtype)
        torch.set_autocast_cache_enabled(cache)
        return False
