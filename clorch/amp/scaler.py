"""Dynamic loss scaling for fp16 training, overflow-checked across all ranks.

`GradScaler` takes torch.amp.GradScaler's arguments and call sequence:

    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)          # optional, e.g. before clip_grad_norm_
    scaler.step(optimizer)              # skips the step if any rank overflowed
    scaler.update()                     # backoff on overflow, growth after growth_interval clean steps

What clorch adds: the found-inf flag is all-reduced (max) across every rank of
the initialized group, so every rank skips the same steps (torch's scaler
decides per rank); sharded (DTensor) gradients, as `parallel=fsdp` has them,
are unscaled shard by shard on each rank, which with that all-reduce is what
torch's `ShardedGradScaler` does; unscaling uses the fused multi-tensor kernel, and
`unscale_flat_` unscales gradients through the flat buffers that hold them
(DDP's buckets, which `DDPStrategy` hands to `MixedPrecision.optimizer_step`);
`skipped_steps` and `last_step_skipped` count overflows. `clorch.amp.step`
is the short path: step then update.
`clorch.amp.MixedPrecision` holds a scaler together with autocast, backward
and the step, for a training loop that should not wire them by hand.

The scale lives in a tensor on the gradients' device. Two ways to step:

* With torch's fused Adam or AdamW (`fused=True`, the engine's default on
  CUDA), whose step takes the overflow flag itself, nothing is read on the
  host: the flag is all-reduced on the device, handed to the fused kernel
  (which leaves parameters and state untouched when it is set), and the
  scale and growth tracker are updated on the device (`torch._amp_update_scale_`),
  so an fp16 step synchronizes no more than a bf16 step. `step()` then
  returns a 0-d bool tensor (reading it synchronizes). The host's view of
  the scale, the skipped steps and the growth tracker catches up, in one read,
  when one of them is asked for (`get_scale()`, `skipped_steps`,
  `state_dict()`, ...) or every `loss_scale.CATCH_UP_STEPS` steps.
* Otherwise `step()` reads the flag on the host once (one synchronization),
  skips or steps, and `update()` decides on the host.

The scale itself (host and device copies, the update rule, the checks of
factors and of state dicts) is `clorch.amp.loss_scale`; this module keeps
torch's call sequence and the agreement across ranks.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from clorch.amp.loss_scale import LossScale, check_factors, checked_state, positive
from clorch.distributed import collectives
from clorch.distributed.groups import device as group_device, is_initialized, world_size

_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"
_DEVICE_SKIP_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW)


class ScalerStateError(RuntimeError, ValueError):
    """A GradScaler method called out of torch's order (RuntimeError, as torch raises)."""


def _device_type(device: object) -> str:
    if isinstance(device, torch.device):
        return device.type
    if isinstance(device, str) and device.split(":")[0] in ("cuda", "cpu"):
        return device.split(":")[0]
    raise ValueError(f"device must be 'cuda' or 'cpu' (or a torch.device), got {device!r}")


def _has_sharded_parameters(optimizer: torch.optim.Optimizer) -> bool:
    return any(isinstance(p, DTensor) for group in optimizer.param_groups for p in group["params"])


def _kept_by_loss_scale(name: str) -> property:
    """A GradScaler attribute held by its LossScale, where the update rule reads it."""
    return property(
        lambda self: getattr(self._loss_scale, name), lambda self, value: setattr(self._loss_scale, name, value)
    )


class GradScaler:
    """Dynamic loss scaler with torch.amp.GradScaler's interface; see the module docstring.

    Args:
        device: "cuda" or "cpu", the device type of the gradients. "cuda" on a
            machine without CUDA disables the scaler with a warning, as torch's does.
        init_scale: starting scale, > 0 (`initial_scale` is an alias).
        growth_factor: multiply the scale by this after growth_interval clean steps, > 1.
        backoff_factor: multiply the scale by this on overflow, in (0, 1).
        growth_interval: clean steps (int >= 1) before the scale grows.
        enabled: False makes every method a pass-through (scale 1, always step).

    Raises:
        ValueError: an invalid device, scale, factor or interval.
        TypeError: enabled is not a bool.
    """

    growth_factor = _kept_by_loss_scale("growth_factor")
    backoff_factor = _kept_by_loss_scale("backoff_factor")
    growth_interval = _kept_by_loss_scale("growth_interval")

    def __init__(
        self,
        device: str = "cuda",
        init_scale: float = 65536.0,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        *,
        initial_scale: float | None = None,
    ):
        self.device = _device_type(device)
        scale = init_scale if initial_scale is None else initial_scale
        positive("init_scale", scale)
        check_factors(growth_factor, backoff_factor, growth_interval)
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be a bool, got {enabled!r}")
        if enabled and self.device == "cuda" and not torch.cuda.is_available():
            warnings.warn("GradScaler(device='cuda') on a machine without CUDA: the scaler is disabled", stacklevel=2)
            enabled = False
        self.enabled = enabled
        self._loss_scale = LossScale(scale, growth_factor, backoff_factor, growth_interval)
        self._stages: dict[int, str] = {}  # id(optimizer) -> stage
        self._found: dict[int, dict[torch.device, torch.Tensor]] = {}  # id(optimizer) -> flags
        self._skipped_since_update: list[bool] = []

    # -- scaling ---------------------------------------------------------------------------

    def scale(self, outputs: Any) -> Any:
        """`outputs` (a tensor, or a list/tuple of them) times the current scale. Local, no sync."""
        if not self.enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            self._loss_scale.place(outputs.device)
            return outputs * self._loss_scale.tensor.to(outputs.device)
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise TypeError(f"outputs must be a torch.Tensor or a list/tuple of them, got {type(outputs).__name__}")

    # -- unscaling -------------------------------------------------------------------------

    def _grad_groups(self, optimizer: torch.optim.Optimizer) -> dict[tuple, list[torch.Tensor]]:
        groups: dict[tuple, list[torch.Tensor]] = {}
        for group in optimizer.param_groups:
            for param in group["params"]:
                grad = param.grad
                if isinstance(grad, DTensor):
                    # A sharded gradient (parallel=fsdp): this rank's shard, unscaled in place. The
                    # found-inf flag is then this rank's, and step() all-reduces it over the ranks.
                    grad = grad.to_local()
                if grad is not None:
                    groups.setdefault((grad.device, grad.dtype), []).append(grad)
        return groups

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide `optimizer`'s gradients by the scale and record inf/nan, with fused kernels.

        Local (no collective, no host sync). At most once per optimizer per
        step, before `step` (which unscales otherwise), e.g. before clipping.

        Raises:
            ScalerStateError: called twice since the last update(), or after step().
        """
        if not self.enabled:
            return
        self._check_unscalable(optimizer, "unscale_")
        self._unscale(optimizer, self._grad_groups(optimizer))

    def unscale_flat_(self, optimizer: torch.optim.Optimizer, flats: list[torch.Tensor] | tuple) -> None:
        """`unscale_(optimizer)` over the flat buffers that hold its gradients, one kernel per buffer.

        For gradients that are views of a few large buffers, as DDP's buckets
        are (`MixedPrecision.optimizer_step` calls it when `DDPStrategy` hands
        it the buckets every gradient of the optimizer views): the gradients are read and
        divided through `flats`, never one by one. Every element of `flats`
        is divided by the scale and checked for inf/nan, so the caller must
        make sure that `flats` covers every gradient of `optimizer` (a
        gradient outside them would stay scaled, and its overflow unseen) and
        holds nothing else that must keep its value (padding and zeros are
        harmless). `optimizer.param_groups` is not read.

        torch.amp.GradScaler.unscale_'s rules otherwise: call it at most once
        per optimizer per step, after the backward and before `step()`, which
        then does not unscale again (and, like `unscale_`, not after
        `step()` until `update()`). A pass-through when the scaler is
        disabled. Local: no collective and no host sync (the found-inf
        flags are all-reduced by `step()`).

        Args:
            optimizer: the optimizer whose gradients `flats` hold; its
                found-inf flags are recorded under it for `step()`.
            flats: floating tensors (a list or tuple) holding every gradient
                of `optimizer`.

        Raises:
            TypeError: flats is not a list or tuple of floating tensors.
            ScalerStateError: the gradients were already unscaled since the
                last update() (by unscale_() or unscale_flat_()), or step()
                was called since.
        """
        if not isinstance(flats, (list, tuple)) or not all(
            isinstance(flat, torch.Tensor) and flat.is_floating_point() for flat in flats
        ):
            raise TypeError(f"flats must be a list or tuple of floating tensors, got {flats!r:.200}")
        if not self.enabled:
            return
        self._check_unscalable(optimizer, "unscale_flat_")
        groups: dict[tuple, list[torch.Tensor]] = {}
        for flat in flats:
            groups.setdefault((flat.device, flat.dtype), []).append(flat)
        self._unscale(optimizer, groups)

    def is_unscaled(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether `optimizer`'s gradients of this step are already unscaled. Local.

        True after `unscale_`, `unscale_flat_` or `step` for it since the last
        `update()` (so `step()` will not unscale them again, and another
        unscale raises); False before, and always when the scaler is disabled.
        """
        return self.enabled and self._stages.get(id(optimizer), _READY) != _READY

    def _check_unscalable(self, optimizer: torch.optim.Optimizer, caller: str) -> None:
        stage = self._stages.get(id(optimizer), _READY)
        if stage == _UNSCALED:
            if caller == "unscale_":
                raise ScalerStateError(
                    "unscale_() has already been called on this optimizer since the "
                    "last update(); call it at most once per step"
                )
            raise ScalerStateError(
                f"{caller}(): this optimizer's gradients were already unscaled since "
                "the last update() (by unscale_() or unscale_flat_()); unscale them "
                "at most once per step"
            )
        if stage == _STEPPED:
            raise ScalerStateError(f"{caller}() is being called after step(); call update() first")

    def _unscale(self, optimizer: torch.optim.Optimizer, groups: dict[tuple, list[torch.Tensor]]) -> None:
        found_by_device = self._found.setdefault(id(optimizer), {})
        loss_scale = self._loss_scale
        for (device, _), grads in groups.items():
            loss_scale.place(loss_scale.tensor.device if loss_scale.tensor is not None else device)
            found = found_by_device.get(device)
            if found is None:
                found = found_by_device[device] = torch.zeros(1, dtype=torch.float32, device=device)
            inverse = loss_scale.inverse
            inv_scale = inverse if device == inverse.device else inverse.to(device)
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv_scale)
        self._stages[id(optimizer)] = _UNSCALED

    def _found_inf(self, optimizer: torch.optim.Optimizer) -> torch.Tensor:
        """This optimizer's found-inf flags folded into one tensor on the collective device."""
        flags = list(self._found.get(id(optimizer), {}).values())
        target = group_device() if is_initialized() else (flags[0].device if flags else torch.device("cpu"))
        if len(flags) == 1 and flags[0].device == target:
            return flags[0]  # the usual case: one device, reduced in place and zeroed after
        if not flags:
            return torch.zeros(1, dtype=torch.float32, device=target)
        return sum(flag.to(target) for flag in flags)

    # -- stepping --------------------------------------------------------------------------

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> bool:
        """Unscale (if not yet), agree on overflow across ranks, then step or skip `optimizer`.

        Every rank of the initialized group must call it once per optimizer
        per step: it all-reduces (max) one found-inf flag, so every rank skips
        together. With a fused optimizer on CUDA the decision stays on the
        device (no host wait); otherwise it blocks on one host read of the
        flag. Outside a group it is local. Call `update()` after stepping
        every optimizer.

        Returns:
            True when the optimizer stepped, False when every rank skipped it;
            decided on the device, a 0-d bool tensor saying the same (reading
            it synchronizes). (torch's scaler returns the optimizer's return
            value instead.)

        Raises:
            TypeError: optimizer has no step().
            ScalerStateError: step() was already called for it since the last update().
        """
        if not callable(getattr(optimizer, "step", None)):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if not self.enabled:
            optimizer.step(*args, **kwargs)
            return True
        stage = self._stages.get(id(optimizer), _READY)
        if stage == _STEPPED:
            raise ScalerStateError(
                "step() has already been called since the last update(); "
                "call scaler.update() once per step, after stepping every optimizer"
            )
        if stage == _READY:
            self._unscale(optimizer, self._grad_groups(optimizer))
        found = self._found_inf(optimizer)
        if is_initialized() and world_size() > 1:
            collectives.all_reduce(found, op="max")
        if self._decides_on_device(optimizer, found):
            flag = found.reshape(()).clone()  # 0-d, as the fused kernels take it
            optimizer.grad_scale, optimizer.found_inf = None, flag  # the fused kernel skips on the flag
            try:
                optimizer.step(*args, **kwargs)
            finally:
                del optimizer.grad_scale, optimizer.found_inf
            outcome: bool | torch.Tensor = flag
            stepped: bool | torch.Tensor = flag == 0
        else:
            self._loss_scale.catch_up()
            skipped = bool(found.item())  # the one host read of the step
            if not skipped:
                optimizer.step(*args, **kwargs)
            outcome, stepped = skipped, not skipped
        self._stages[id(optimizer)] = _STEPPED
        self._skipped_since_update.append(outcome)
        for flag_tensor in self._found.get(id(optimizer), {}).values():
            flag_tensor.zero_()
        return stepped

    def _decides_on_device(self, optimizer: torch.optim.Optimizer, found: torch.Tensor) -> bool:
        """Whether the skip can stay on the device: fused Adam or AdamW, whose kernels take found_inf.

        Only those two: they leave parameters and state as they were on a
        skipped step. (torch's fused SGD with momentum, for one, creates its
        momentum buffers uninitialized on a first step it then skips.) Not for
        sharded (DTensor) parameters: their fused step would take a plain flag
        beside DTensors, so the skip is decided on the host.
        """
        return (
            type(optimizer) in _DEVICE_SKIP_OPTIMIZERS
            and getattr(optimizer, "_step_supports_amp_scaling", False)
            and self._scale is not None
            and self._scale.device == found.device
            and not _has_sharded_parameters(optimizer)
        )

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """Adjust the scale after this step's optimizers stepped (or set `new_scale`). Local.

        Backoff when any optimizer's step was skipped, growth after
        `growth_interval` clean steps; `new_scale` replaces the scale instead.

        Raises:
            ScalerStateError: no step() since the last update() (and no new_scale).
            ValueError: new_scale is not a finite number > 0.
        """
        if not self.enabled:
            return
        if new_scale is not None:
            self._loss_scale.replace(new_scale)
        else:
            outcomes = self._skipped_since_update
            if not outcomes:
                raise ScalerStateError(
                    "update() was called without a step(optimizer) since the last "
                    "update(); call scaler.step(optimizer) first"
                )
            if all(isinstance(outcome, bool) for outcome in outcomes):
                self._loss_scale.update_on_host(any(outcomes))
            else:
                self._loss_scale.update_on_device(outcomes)
        self._stages.clear()
        self._skipped_since_update = []

    # -- the host's view (caught up from device-decided steps when read) --------------------
    @property
    def skipped_steps(self) -> int:
        """Steps skipped for overflow since the scaler was made (restored by load_state_dict)."""
        self._loss_scale.catch_up()
        return self._loss_scale.skipped

    @property
    def last_step_skipped(self) -> bool:
        """Whether the last update() followed a skipped step."""
        self._loss_scale.catch_up()
        return self._loss_scale.last_skipped

    @property
    def _growth_tracker(self) -> int:
        self._loss_scale.catch_up()
        return self._loss_scale.tracker

    @property
    def _scale(self) -> torch.Tensor | None:
        """The scale on the gradients' device (torch's scaler has it under this name too)."""
        return self._loss_scale.tensor

    @property
    def _inv_scale(self) -> torch.Tensor | None:
        """1 / scale on the gradients' device."""
        return self._loss_scale.inverse

    # -- torch's getters and setters -------------------------------------------------------

    def get_scale(self) -> float:
        """The current scale (1.0 when disabled). Synchronizes only to catch up with device-decided steps."""
        self._loss_scale.catch_up()
        return self._loss_scale.value if self.enabled else 1.0

    def is_enabled(self) -> bool:
        """Whether scaling is on."""
        return self.enabled

    def get_growth_factor(self) -> float:
        return self.growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        check_factors(new_factor, self.backoff_factor, self.growth_interval)
        self.growth_factor = float(new_factor)

    def get_backoff_factor(self) -> float:
        return self.backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        check_factors(self.growth_factor, new_factor, self.growth_interval)
        self.backoff_factor = float(new_factor)

    def get_growth_interval(self) -> int:
        return self.growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        check_factors(self.growth_factor, self.backoff_factor, new_interval)
        self.growth_interval = new_interval

    def _get_growth_tracker(self) -> int:
        return self._growth_tracker if self.enabled else 0

    # -- state -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """torch.amp.GradScaler's state dict plus `skipped_steps` ({} when disabled, as torch)."""
        return self._loss_scale.state_dict() if self.enabled else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state dict of this class or of torch.amp.GradScaler.

        Also reads clorch's earlier key `growth_tracker`; `skipped_steps` is optional.

        Raises:
            TypeError: state is not a dict.
            ValueError: empty (saved while disabled), a key is missing, or a value is invalid.
        """
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from GradScaler.state_dict(), got {type(state).__name__}")
        if not self.enabled:
            return
        self._loss_scale.load_state_dict(checked_state(state))


def backward(scaler: GradScaler | None, loss: torch.Tensor) -> None:
    """`scaler.scale(loss).backward()`; plain `loss.backward()` when scaler is None."""
    (loss if scaler is None else scaler.scale(loss)).backward()


def step(scaler: GradScaler | None, optimizer: torch.optim.Optimizer) -> bool | torch.Tensor:
    """`scaler.step(optimizer)` then `scaler.update()`; plain `optimizer.step()` when scaler is None.

    Returns:
        True when the optimizer stepped, False when the scaler skipped it (a
        0-d bool tensor when the scaler decided on the device, see `GradScaler.step`).
    """
    if scaler is None:
        optimizer.step()
        return True
    stepped = scaler.step(optimizer)
    scaler.update()
    return stepped
