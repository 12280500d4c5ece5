"""Precision modes: the one table behind the config, autocast, the loss scaler and DDP's reduce_dtype.

Each mode (`fp32`, `bf16`, `fp16`) says which torch dtype it computes in,
whether the forward runs under autocast and whether a `GradScaler` runs. The
config's `precision.name` and `ddp.reduce_dtype` choices, `clorch.amp`'s
string dtypes and `DistributedDataParallel(reduce_dtype=...)` all read it, so
a name accepted in one place is accepted in all of them. A row says what a
mode means; `clorch.amp.MixedPrecision` is the runtime object built from one
(autocast, scaler, backward and optimizer step on a device).

Importing this module does not import torch: composing and checking a config
must stay fast and work where torch is not importable, so modes name their
dtype by attribute name and only the methods that return a dtype import torch.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Precision", "PRECISIONS", "DTYPE_NAMES", "get_precision", "torch_dtype"]

_DEVICE_TYPES = ("cuda", "cpu")


@dataclass(frozen=True)
class Precision:
    """One precision mode: its names, its dtype and what runs with it.

    Attributes:
        name: canonical config name ("fp32", "bf16", "fp16").
        dtype_name: attribute of `torch` holding the dtype ("float32", "bfloat16", "float16").
        aliases: other names accepted for this mode (torch's dtype names).
        autocast: whether the forward runs under autocast (False for fp32).
        uses_scaler: whether a GradScaler scales the loss (fp16 only: its
            narrow exponent range underflows small gradients).
    """

    name: str
    dtype_name: str
    aliases: tuple[str, ...]
    autocast: bool
    uses_scaler: bool

    @property
    def names(self) -> tuple[str, ...]:
        """Every name this mode is accepted under: the canonical one first, then the aliases."""
        return (self.name, *self.aliases)

    def torch_dtype(self):
        """The torch dtype, e.g. `torch.bfloat16` (imports torch)."""
        # lazy: keeps torch out of clorch-train's start
        import torch

        return getattr(torch, self.dtype_name)

    def autocast_dtype(self):
        """The dtype autocast runs the forward in, or None when this mode runs no autocast (fp32)."""
        return self.torch_dtype() if self.autocast else None

    def describe(self, device_type: str) -> str:
        """How a job runs in this mode, in words for the user.

        "fp32"; "bf16 autocast" and "fp16 autocast with loss scaling" on CUDA;
        "bf16 CPU autocast" and "fp16 CPU autocast with loss scaling" on the CPU.

        Args:
            device_type: "cuda" or "cpu".

        Raises:
            ValueError: device_type is not "cuda" or "cpu".
        """
        if device_type not in _DEVICE_TYPES:
            raise ValueError(f"device_type must be one of {', '.join(_DEVICE_TYPES)}, got {device_type!r}")
        if not self.autocast:
            return self.name
        # CPU autocast covers fewer ops than CUDA's and is much slower; say which one runs.
        text = f"{self.name} {'CPU autocast' if device_type == 'cpu' else 'autocast'}"
        return text + " with loss scaling" if self.uses_scaler else text


PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in (
        Precision("fp32", "float32", ("float32",), autocast=False, uses_scaler=False),
        Precision("bf16", "bfloat16", ("bfloat16",), autocast=True, uses_scaler=False),
        Precision("fp16", "float16", ("float16",), autocast=True, uses_scaler=True),
    )
}
"""Canonical name -> precision mode, in the order error messages list them."""

_BY_NAME: dict[str, Precision] = {name: p for p in PRECISIONS.values() for name in p.names}

DTYPE_NAMES: dict[str, str] = {name: p.dtype_name for name, p in _BY_NAME.items()}
"""Every accepted name (canonical names and aliases) -> the torch dtype's attribute name.

The names clorch accepts as config values (`precision.name` takes the canonical
ones, `ddp.reduce_dtype` all of them), as `reduce_dtype=` and as autocast's `dtype=`.
"""


def _allowed() -> str:
    aliases = [alias for p in PRECISIONS.values() for alias in p.aliases]
    return f"{', '.join(PRECISIONS)} (or {', '.join(aliases)})"


def get_precision(name: str) -> Precision:
    """The precision mode called `name` (a canonical name of `PRECISIONS` or an alias).

    Raises:
        TypeError: name is not a str.
        ValueError: name is no precision's name or alias.
    """
    if not isinstance(name, str):
        raise TypeError(f"precision must be a str, one of {_allowed()}, got {name!r} ({type(name).__name__})")
    found = _BY_NAME.get(name)
    if found is None:
        raise ValueError(f"precision must be one of {_allowed()}, got {name!r}")
    return found


def torch_dtype(name: str):
    """The torch dtype for a name of `DTYPE_NAMES`, e.g. `torch_dtype("bf16")` (imports torch).

    Raises:
        TypeError: name is not a str.
        ValueError: name is not in `DTYPE_NAMES`.
    """
    return get_precision(name).torch_dtype()
