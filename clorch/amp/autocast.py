"""Autocast: run the body's eligible ops in a lower precision, restore the thread's state after.

bf16 uses autocast without a scaler; fp16 uses autocast and `GradScaler`;
fp32 uses neither (see `precision_settings`).
"""

from __future__ import annotations

import contextlib

import torch

DEVICES = ("cuda", "cpu")
DTYPES = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16,
}
PRECISIONS = {"fp32": (None, False), "bf16": (torch.bfloat16, False), "fp16": (torch.float16, True)}


def precision_settings(precision: str) -> tuple[torch.dtype | None, bool]:
    """(autocast dtype or None, whether a GradScaler is needed) for "fp32", "bf16" or "fp16"."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return PRECISIONS[precision]


def _resolve_dtype(dtype: object) -> torch.dtype:
    if dtype in (torch.bfloat16, torch.float16):
        return dtype  # type: ignore[return-value]
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"dtype must be torch.bfloat16, torch.float16 or one of "
                     f"{', '.join(DTYPES)}, got {dtype!r}")


class autocast(contextlib.ContextDecorator):
    """Context manager (or decorator) enabling autocast on `device` for its body.

    On exit, also when the body raises and when nested, the thread's previous
    autocast enabled flag and dtype for `device` and the cache setting are
    restored; the cast cache is cleared when the outermost autocast exits.

    Args:
        device: "cuda" or "cpu".
        dtype: torch.bfloat16 / torch.float16 (or "bf16", "fp16").
        enabled: False runs the body in full precision (still restoring state).
        cache_enabled: cache casts of weights within the outermost region.

    Raises:
        ValueError: unknown device or dtype.
        TypeError: enabled or cache_enabled not a bool.
    """

    def __init__(self, device: str = "cuda", dtype: object = torch.bfloat16, enabled: bool = True,
                 cache_enabled: bool = True):
        if device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
        for name, value in (("enabled", enabled), ("cache_enabled", cache_enabled)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {value!r}")
        self.device = device
        self.dtype = _resolve_dtype(dtype)
        self.enabled = enabled
        self.cache_enabled = cache_enabled
        self._saved: list[tuple[bool, torch.dtype, bool]] = []

    def __enter__(self) -> "autocast":
        device = self.device
        # A stack, so one instance may be entered again while active.
        self._saved.append((torch.is_autocast_enabled(device), torch.get_autocast_dtype(device),
                            torch.is_autocast_cache_enabled()))
        torch.set_autocast_enabled(device, self.enabled)
        torch.set_autocast_dtype(device, self.dtype)
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
