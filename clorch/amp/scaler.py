"""Dynamic loss scaling for fp16 training, overflow-checked across all ranks.

Per step: `scale(loss)` -> backward -> `step(optimizer)`, which unscales the
gradients with the fused multi-tensor kernel, all-reduces (max) one found-inf
flag across every rank of the initialized group, reads it on the host once
(the step-or-skip decision; the only host read of the step), steps or skips
the optimizer on every rank alike, and **updates the scale itself** (backoff
on overflow, growth after `growth_interval` clean steps). `update()` exists
for code written against torch's API and does nothing.

The scale lives in a tensor on the gradients' device; because every update is
decided on the host from that one read, the host keeps an exact float32
mirror, so `get_scale()` never synchronizes.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import torch

from clorch.distributed import collectives
from clorch.distributed.process_group import device as group_device, is_initialized, world_size

STATE_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "growth_tracker",
              "skipped_steps")


def _f32(value: float) -> float:
    """Round to float32, the precision of the device scale."""
    return struct.unpack("f", struct.pack("f", value))[0]


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _check_factors(growth_factor: object, backoff_factor: object, growth_interval: object) -> None:
    if _positive("growth_factor", growth_factor) <= 1:
        raise ValueError(f"growth_factor must be > 1, got {growth_factor!r}")
    if not 0 < _positive("backoff_factor", backoff_factor) < 1:
        raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor!r}")
    if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) or growth_interval < 1:
        raise ValueError(f"growth_interval must be an int >= 1 (steps), got {growth_interval!r}")


class GradScaler:
    """Dynamic loss scaler; see the module docstring for the per-step protocol.

    Args:
        initial_scale: starting scale, > 0.
        growth_factor: multiply the scale by this after growth_interval clean steps, > 1.
        backoff_factor: multiply the scale by this on overflow, in (0, 1).
        growth_interval: clean steps (int >= 1) before the scale grows.
        enabled: False makes every method a pass-through (scale 1, always step).

    Raises:
        ValueError: an invalid scale, factor or interval.
    """

    def __init__(self, initial_scale: float = 65536.0, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True):
        _positive("initial_scale", initial_scale)
        _check_factors(growth_factor, backoff_factor, growth_interval)
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be a bool, got {enabled!r}")
        self.enabled = enabled
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = growth_interval
        self._scale_value = _f32(float(initial_scale))
        self._growth_tracker = 0
        self.skipped_steps = 0
        self.last_step_skipped = False
        self._scale: torch.Tensor | None = None
        self._inv_scale: torch.Tensor | None = None
        self._found: dict[torch.device, torch.Tensor] = {}
        self._unscaled: set[int] = set()

    def _device_tensors(self, device: torch.device) -> None:
        if self._scale is None or self._scale.device != device:
            self._scale = torch.full((), self._scale_value, dtype=torch.float32, device=device)
            self._inv_scale = torch.full((), 1.0 / self._scale_value, dtype=torch.float32, device=device)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """`loss` times the current scale (unchanged when disabled). Local, no sync."""
        if not self.enabled:
            return loss
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"loss must be a torch.Tensor, got {type(loss).__name__}")
        self._device_tensors(loss.device)
        return loss * self._scale

    def _grad_groups(self, optimizer: torch.optim.Optimizer) -> dict[tuple, list[torch.Tensor]]:
        groups: dict[tuple, list[torch.Tensor]] = {}
        for group in optimizer.param_groups:
            for param in group["params"]:
                grad = param.grad
                if grad is not None:
                    groups.setdefault((grad.device, grad.dtype), []).append(grad)
        return groups

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide `optimizer`'s gradients by the scale and record inf/nan, with fused kernels.

        Local (no collective, no host sync). Call at most once per optimizer
        per step, e.g. before gradient clipping; `step` calls it otherwise.

        Raises:
            ValueError: called a second time for `optimizer` since the last step().
        """
        if not self.enabled:
            return
        if id(optimizer) in self._unscaled:
            raise ValueError("unscale_(optimizer) was already called for this optimizer since the "
                             "last step(); call it at most once per step")
        self._unscale(optimizer, self._grad_groups(optimizer))

    def _unscale_flat_(self, optimizer: torch.optim.Optimizer, flats: list[torch.Tensor]) -> None:
        """DDP's shortcut: `optimizer`'s gradients are exactly views of `flats` (a few buffers)."""
        if not self.enabled or id(optimizer) in self._unscaled:
            return
        groups: dict[tuple, list[torch.Tensor]] = {}
        for flat in flats:
            groups.setdefault((flat.device, flat.dtype), []).append(flat)
        self._unscale(optimizer, groups)

    def _unscale(self, optimizer: torch.optim.Optimizer, groups: dict[tuple, list[torch.Tensor]]) -> None:
        for (device, _), grads in groups.items():
            self._device_tensors(self._scale.device if self._scale is not None else device)
            found = self._found.get(device)
            if found is None:
                found = self._found[device] = torch.zeros(1, dtype=torch.float32, device=device)
            inv_scale = self._inv_scale if device == self._inv_scale.device else self._inv_scale.to(device)
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv_scale)
        self._unscaled.add(id(optimizer))

    def _found_inf(self) -> torch.Tensor:
        """This rank's found-inf flags folded into one tensor on the collective device."""
        target = group_device() if is_initialized() else next(iter(self._found), torch.device("cpu"))
        flags = list(self._found.values())
        if len(flags) == 1 and flags[0].device == target:
            return flags[0]  # the usual case: one device, reduced in place and zeroed after
        if not flags:
            return torch.zeros(1, dtype=torch.float32, device=target)
        return sum(flag.to(target) for flag in flags)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Unscale (if not yet), agree on overflow across ranks, step or skip, update the scale.

        Every rank of the initialized group must call it once per step: it
        all-reduces (max) one found-inf flag and blocks on one host read of
        it. Outside a group it is local.

        Returns:
            True when the optimizer stepped, False when every rank skipped it.
        """
        if not callable(getattr(optimizer, "step", None)):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if not self.enabled:
            optimizer.step()
            self.last_step_skipped = False
            return True
        if id(optimizer) not in self._unscaled:
            self.unscale_(optimizer)
        found = self._found_inf()
        if is_initialized() and world_size() > 1:
            collectives.all_reduce(found, op="max")
        skipped = bool(found.item())  # the one host read of the step
        if not skipped:
            optimizer.step()
        self._update(skipped)
        for flag in self._found.values():
            flag.zero_()
        self._unscaled.clear()
        return not skipped

    def _update(self, skipped: bool) -> None:
        self.last_step_skipped = skipped
        previous = self._scale_value
        if skipped:
            self.skipped_steps += 1
            self._growth_tracker = 0
            self._scale_value = _f32(self._scale_value * self.backoff_factor)
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self.growth_interval:
                self._growth_tracker = 0
                self._scale_value = _f32(self._scale_value * self.growth_factor)
        if self._scale_value != previous and self._scale is not None:
            self._scale.fill_(self._scale_value)
            self._inv_scale.fill_(1.0 / self._scale_value)

    def update(self) -> None:
        """Does nothing: `step()` already updated the scale (kept for torch-style loops)."""

    def get_scale(self) -> float:
        """The current scale (1.0 when disabled). No device sync."""
        return self._scale_value if self.enabled else 1.0

    def state_dict(self) -> dict[str, Any]:
        """Scale, factors, growth tracker and skipped-step count (plain Python values)."""
        return {"scale": self._scale_value, "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "growth_tracker": self._growth_tracker, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict()` returned.

        Raises:
            TypeError: state is not a dict.
            ValueError: a key is missing or a value is invalid.
        """
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from GradScaler.state_dict(), got {type(state).__name__}")
        missing = [key for key in STATE_KEYS if key not in state]
        if missing:
            raise ValueError(f"state is missing key(s) {missing}; expected {list(STATE_KEYS)}")
        _positive("state['scale']", state["scale"])
        _check_factors(state["growth_factor"], state["backoff_factor"], state["growth_interval"])
        for key in ("growth_tracker", "skipped_steps"):
            if isinstance(state[key], bool) or not isinstance(state[key], int) or state[key] < 0:
                raise ValueError(f"state[{key!r}] must be an int >= 0, got {state[key]!r}")
        self.growth_factor = float(state["growth_factor"])
        self.backoff_factor = float(state["backoff_factor"])
        self.growth_interval = state["growth_interval"]
        self._growth_tracker = state["growth_tracker"]
        self.skipped_steps = state["skipped_steps"]
        self._scale_value = _f32(float(state["scale"]))
        if self._scale is not None:
            self._scale.fill_(self._scale_value)
            self._inv_scale.fill_(1.0 / self._scale_value)


def backward(scaler: GradScaler | None, loss: torch.Tensor) -> None:
    """`scaler.scale(loss).backward()`; plain `loss.backward()` when scaler is None."""
    (loss if scaler is None else scaler.scale(loss)).backward()


def step(scaler: GradScaler | None, optimizer: torch.optim.Optimizer) -> bool:
    """`scaler.step(optimizer)` (see GradScaler.step); plain `optimizer.step()` when scaler is None."""
    if scaler is None:
        optimizer.step()
        return True
    return scaler.step(optimizer)
