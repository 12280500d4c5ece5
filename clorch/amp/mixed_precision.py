"""`MixedPrecision`: one object that owns autocast, the loss scaler, backward and the optimizer step.

Lightning Fabric's precision plugin, for clorch: a training loop made with it
does not wire autocast and the scaler by hand, and reads the same calls in
every precision mode:

    precision = MixedPrecision("fp16", device)      # or "bf16", "fp32"
    with precision.autocast():
        loss = loss_fn(model(x), y)
    precision.backward(loss)
    stepped = precision.optimizer_step(optimizer)     # then optimizer.zero_grad()

A parallel strategy (`clorch.strategies`) drives it: `DDPStrategy.optimizer_step` hands it
DDP's flat buckets (`flats`) and zeroes the gradients after.

What each mode runs (the modes and their names are `clorch.precision`'s table):

* "fp32": no autocast (the context runs its body in full precision), plain
  backward and step.
* "bf16": the forward under bf16 autocast; plain backward and step (bf16 has
  fp32's exponent range: no loss scaling).
* "fp16": the forward under fp16 autocast; a `GradScaler` scales the loss,
  unscales the gradients, skips the step where any rank overflowed and
  updates the scale.

Named `MixedPrecision`, not `Precision`: `clorch.precision.Precision` is the
table row that says what a mode name means, importable without torch (the
config checks names with it); this class is the runtime object built from one
of those rows, a device and a scaler.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

from clorch.amp.autocast import autocast
from clorch.amp.scaler import GradScaler, step as step_then_update
from clorch.precision import Precision, get_precision

_DEVICE_TYPES = ("cuda", "cpu")


def _checked_device(device: object) -> torch.device:
    try:
        found = torch.device(device)  # type: ignore[arg-type]
    except (TypeError, RuntimeError):
        found = None
    if found is None or found.type not in _DEVICE_TYPES:
        raise ValueError(f"device must be 'cuda', 'cuda:N' or 'cpu' (or a torch.device), got {device!r}")
    return found


def _checked_scaler(mode: Precision, device: torch.device, scaler: object) -> GradScaler | None:
    """The scaler that runs in `mode` on `device`, from `MixedPrecision`'s `scaler` argument."""
    if scaler is False or (scaler is None and not mode.uses_scaler):
        return None
    if not mode.uses_scaler:
        raise ValueError(
            f"scaler is for precision fp16 only ({mode.name} needs no loss scaling), got {scaler!r}: pass scaler=None"
        )
    if scaler is None or scaler is True:
        return GradScaler(device.type)  # GradScaler's own defaults: they are kept in its signature only
    if isinstance(scaler, GradScaler):
        if scaler.device != device.type:
            raise ValueError(
                f"scaler was made for device {scaler.device!r}, but this precision runs on {device.type!r}"
            )
        return scaler
    if isinstance(scaler, Mapping):
        if "device" in scaler:
            raise TypeError("scaler settings must not name 'device': the scaler runs on MixedPrecision's device")
        return GradScaler(device.type, **scaler)
    raise TypeError(
        "scaler must be None, a bool, a clorch.amp.GradScaler or a mapping of GradScaler's "
        f"arguments, got {type(scaler).__name__}"
    )


def step_scaler(optimizer: object, scaler: object) -> Any:
    """The loss scaler a step of `optimizer` goes through, checked: `scaler` itself, a
    MixedPrecision's `scaler`, or None. Local.

    Raises:
        TypeError: optimizer has no step(), or scaler has no step().
    """
    if isinstance(scaler, MixedPrecision):
        scaler = scaler.scaler
    if not callable(getattr(optimizer, "step", None)):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if scaler is not None and not callable(getattr(scaler, "step", None)):
        raise TypeError(f"scaler must be a clorch.amp.GradScaler or None, got {type(scaler).__name__}")
    return scaler


class MixedPrecision:
    """Autocast, loss scaling, backward and the optimizer step of one precision mode; see the module docstring.

    Args:
        precision: a mode name of `clorch.precision` ("fp32", "bf16", "fp16",
            or an alias such as "bfloat16"), or one of its `Precision` rows.
        device: where the forward runs and the gradients live: "cuda",
            "cuda:N", "cpu" or a torch.device.
        scaler: fp16's loss scaler. None (or True): a `GradScaler` with its
            defaults; a mapping: `GradScaler`'s keyword arguments
            (`init_scale`, `growth_factor`, `backoff_factor`,
            `growth_interval`, `enabled`); a `GradScaler`: that one, made for
            the same device type; False: none (fp16 without loss scaling,
            which risks gradients underflowing to zero). fp32 and bf16 take
            None or False only.

    Raises:
        TypeError: precision is not a str or a Precision, or scaler is of another type.
        ValueError: an unknown precision name or device, a scaler with fp32 or
            bf16, a scaler made for another device type, or an invalid scaler
            setting (as `GradScaler` raises it).
    """

    def __init__(
        self,
        precision: str | Precision,
        device: str | torch.device,
        scaler: GradScaler | Mapping[str, Any] | bool | None = None,
    ):
        self.mode: Precision = precision if isinstance(precision, Precision) else get_precision(precision)
        self.device: torch.device = _checked_device(device)
        self._scaler = _checked_scaler(self.mode, self.device, scaler)

    @property
    def name(self) -> str:
        """The mode's canonical name: "fp32", "bf16" or "fp16"."""
        return self.mode.name

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The dtype the forward runs in under `autocast()`, or None for fp32 (no autocast)."""
        return self.mode.autocast_dtype()

    @property
    def scaler(self) -> GradScaler | None:
        """The loss scaler (fp16), or None. Read-only: a precision object keeps the scaler it was made with."""
        return self._scaler

    def __repr__(self) -> str:
        return f"MixedPrecision({self.name!r}, device={str(self.device)!r}, scaler={self._scaler!r})"

    # -- forward and backward ------------------------------------------------------------------

    def autocast(self) -> autocast:
        """A fresh autocast context for the forward pass (or evaluation) in this mode. Local.

        bf16 and fp16 run the body's eligible ops in that dtype; fp32 runs it
        in full precision (autocast off inside, also within an outer autocast).
        The thread's autocast state is restored on exit either way.
        """
        # fp32 is autocast's own "full precision" dtype: the context disables autocast.
        return autocast(self.device.type, dtype=self.mode.torch_dtype())

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """`loss.backward(**kwargs)`, with the loss multiplied by the scale first when a scaler runs.

        Local as far as precision goes (scaling reads no host value). The
        backward itself is a synchronization point when the model is a clorch
        `DistributedDataParallel` outside `no_sync()`: its gradient
        all-reduce, which every rank must reach.

        Args:
            loss: the loss tensor (a scalar, or pass `gradient=` in kwargs).
            **kwargs: `torch.Tensor.backward`'s arguments (`retain_graph`, ...).

        Raises:
            TypeError: loss is not a tensor.
        """
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"loss must be a torch.Tensor, got {type(loss).__name__}")
        (loss if self._scaler is None else self._scaler.scale(loss)).backward(**kwargs)

    def unscale_gradients(self, optimizer: torch.optim.Optimizer, flats: Sequence[torch.Tensor] | None = None) -> None:
        """Divide `optimizer`'s gradients by the scale now, e.g. before clipping them (no-op without a scaler).

        `GradScaler.unscale_`: local, at most once per optimizer per step,
        before `optimizer_step` (which then does not unscale again). With
        `flats` (flat buffers that every gradient of `optimizer` views, such as
        DDP's buckets: a parallel strategy hands them over) those few buffers
        are unscaled instead of each gradient (`GradScaler.unscale_flat_`).

        Raises:
            ScalerStateError: called twice in one step, or after the step.
        """
        if self._scaler is None:
            return
        if flats is not None:
            self._scaler.unscale_flat_(optimizer, flats)
        else:
            self._scaler.unscale_(optimizer)

    # -- the step ------------------------------------------------------------------------------

    def optimizer_step(
        self, optimizer: torch.optim.Optimizer, flats: Sequence[torch.Tensor] | None = None
    ) -> bool | torch.Tensor:
        """Step `optimizer`: with a scaler, unscale, skip if any rank overflowed, and update the scale.

        The gradients are unscaled here unless they were this step
        (`unscale_gradients`): through `flats` where given (flat buffers
        every gradient views, as `DDPStrategy` hands over DDP's buckets),
        else each gradient. The gradients are then left as they are: the
        caller zeroes them before the next backward (as after torch's
        `scaler.step`; a strategy's `optimizer_step` does).

        With a scaler this is a synchronization point: every rank of the
        initialized process group must call it once per step, in the same
        order relative to its other collectives, because the scaler
        all-reduces (max) one found-inf flag so that every rank skips the same
        steps. With gloo the all-reduce blocks until every rank has
        contributed; with NCCL it is ordered on the current stream. Unless
        the optimizer is torch's fused Adam or AdamW on CUDA (the skip then
        stays on the device), the host then blocks on one read of the flag,
        which waits for the all-reduce. Without a scaler (fp32, bf16) it is
        local, and outside a process group (or in a group of one) it is local
        either way.

        Args:
            optimizer: the optimizer to step.
            flats: flat buffers that every gradient of `optimizer` views (unscaled
                at once); None: each gradient.

        Returns:
            True when the optimizer stepped, False when every rank skipped it
            for overflow; where the scaler decided on the device (fused Adam
            or AdamW on CUDA), a 0-d bool tensor saying the same (reading it
            synchronizes). Without a scaler always True.

        Raises:
            TypeError: optimizer has no step().
            ScalerStateError: the scaler already stepped this optimizer since
                its last update.
            RuntimeError: the found-inf all-reduce failed (a rank died or the
                group timed out; the backend's RuntimeError or DistBackendError).
        """
        step_scaler(optimizer, self)  # TypeError for an optimizer (or scaler) that cannot step
        if self._scaler is not None and flats is not None and not self._scaler.is_unscaled(optimizer):
            self._scaler.unscale_flat_(optimizer, flats)
        return step_then_update(self._scaler, optimizer)

    def fsdp_policy(self, param_dtype: str = "auto") -> MixedPrecisionPolicy | None:
        """FSDP2's `MixedPrecisionPolicy` for this mode, or None (fp32: no casts).

        "auto": parameters all-gathered and computed in the mode's dtype (bf16 or fp16),
        gradients reduce-scattered in fp32 into fp32 shards (fp16's scaler unscales those);
        "fp32": parameters gathered in fp32, the casts left to autocast (as under ddp).
        """
        if param_dtype not in ("auto", "fp32"):
            raise ValueError(f"param_dtype must be 'auto' or 'fp32', got {param_dtype!r}")
        if param_dtype == "fp32" or not self.mode.autocast:
            return None
        return MixedPrecisionPolicy(param_dtype=self.mode.torch_dtype(), reduce_dtype=torch.float32)

    # -- readouts and state --------------------------------------------------------------------

    @property
    def scale(self) -> float | None:
        """The current loss scale, or None without a scaler (1.0 for a disabled one).

        Local, but after steps the scaler decided on the device it blocks on
        one host read to catch up (see `GradScaler.get_scale`).
        """
        return None if self._scaler is None else self._scaler.get_scale()

    @property
    def skipped_steps(self) -> int:
        """Steps skipped for overflow since the scaler was made or restored (0 without a scaler).

        Local; may block on one host read, as `scale`.
        """
        return 0 if self._scaler is None else self._scaler.skipped_steps

    def state_dict(self) -> dict[str, Any]:
        """The scaler's state dict (`GradScaler.state_dict`), {} without a scaler.

        The same dict the scaler saves alone, so a checkpoint holding either
        loads into the other. Local; may block on one host read, as `scale`.
        """
        return {} if self._scaler is None else self._scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the scaler's state from `state_dict()` (or a GradScaler's, or torch's).

        Without a scaler there is nothing to restore and `state` is ignored
        (as `clorch.checkpoint.load_checkpoint(scaler=None)` ignores a saved
        scaler). Local.

        Raises:
            TypeError: state is not a dict.
            ValueError: (with a scaler) the state is empty, misses a key or holds an invalid value.
        """
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from MixedPrecision.state_dict(), got {type(state).__name__}")
        if self._scaler is not None:
            self._scaler.load_state_dict(state)
