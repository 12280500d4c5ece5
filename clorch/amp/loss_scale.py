"""The loss scale of `GradScaler`: its value, torch's dynamic update rule, its saved state.

`LossScale` keeps the scale twice: a float on the host, which the user reads
(`get_scale()`, `state_dict()`), and float32 tensors on the gradients' device,
which the kernels multiply by. A step decided on the host updates both at
once. A step decided on the device (`update_on_device`) updates the tensors
with torch's kernel and queues the overflow flag; the host's view replays the
queued flags in one read (`catch_up`) when it is next asked for, or every
`CATCH_UP_STEPS` steps so the queue stays short.

The update rule is torch.amp.GradScaler's: on overflow multiply by
`backoff_factor` and restart the count of clean steps (the growth tracker);
after `growth_interval` clean steps multiply by `growth_factor`.

The checks here (`positive`, `check_factors`, `checked_state`) raise the
ValueErrors that GradScaler's constructor, setters and `load_state_dict`
document.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import torch

CATCH_UP_STEPS = 1024
"""Device-decided steps after which the host's view of the scaler is brought up to date."""

_STATE_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


def f32(value: float) -> float:
    """Round to float32, the precision of the device scale."""
    return struct.unpack("f", struct.pack("f", value))[0]


def positive(name: str, value: object) -> float:
    """`value` as a float; ValueError naming `name` unless it is a finite number > 0 (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def check_factors(growth_factor: object, backoff_factor: object, growth_interval: object) -> None:
    """ValueError unless growth_factor > 1, backoff_factor in (0, 1) and growth_interval an int >= 1."""
    if positive("growth_factor", growth_factor) <= 1:
        raise ValueError(f"growth_factor must be > 1, got {growth_factor!r}")
    if not 0 < positive("backoff_factor", backoff_factor) < 1:
        raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor!r}")
    if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) or growth_interval < 1:
        raise ValueError(f"growth_interval must be an int >= 1 (steps), got {growth_interval!r}")


def checked_state(state: dict[str, Any]) -> dict[str, Any]:
    """A copy of a GradScaler state dict, checked, with clorch's older and optional keys filled in.

    Reads clorch's earlier key `growth_tracker` for `_growth_tracker`;
    `skipped_steps` defaults to 0 (torch.amp.GradScaler does not save it).

    Raises:
        ValueError: empty (saved while disabled), a key is missing, or a value is invalid.
    """
    if not state:
        raise ValueError("the scaler state dict is empty, possibly because it was saved from a disabled GradScaler")
    state = dict(state)
    if "_growth_tracker" not in state and "growth_tracker" in state:
        state["_growth_tracker"] = state["growth_tracker"]
    state.setdefault("skipped_steps", 0)
    missing = [key for key in _STATE_KEYS if key not in state]
    if missing:
        raise ValueError(f"state is missing key(s) {missing}; expected a GradScaler.state_dict()")
    positive("state['scale']", state["scale"])
    check_factors(state["growth_factor"], state["backoff_factor"], state["growth_interval"])
    for key in ("_growth_tracker", "skipped_steps"):
        if isinstance(state[key], bool) or not isinstance(state[key], int) or state[key] < 0:
            raise ValueError(f"state[{key!r}] must be an int >= 0, got {state[key]!r}")
    return state


class LossScale:
    """The scale's host value and device tensors, kept in step by torch's update rule.

    Arguments are taken as already checked (`positive`, `check_factors`).
    Everything here is local to the rank: the overflow flags it is given are
    already agreed across ranks by `GradScaler.step`.
    """

    def __init__(self, value: float, growth_factor: float, backoff_factor: float, growth_interval: int):
        self.value = f32(float(value))  # the host's view of the scale
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = growth_interval
        self.tracker = 0  # clean steps since the last growth or backoff
        self.skipped = 0  # steps skipped for overflow, ever
        self.last_skipped = False
        self.tensor: torch.Tensor | None = None  # the scale on the gradients' device, made on first use
        self.inverse: torch.Tensor | None = None  # 1 / scale there, what unscaling multiplies by
        self.tracker_tensor: torch.Tensor | None = None  # the growth tracker, for device updates
        self.unread: list[torch.Tensor] = []  # overflow flags of device-decided steps, not yet on the host

    def place(self, device: torch.device) -> None:
        """Make the device tensors on `device` unless they are already there."""
        if self.tensor is None or self.tensor.device != device:
            self.tensor = torch.full((), self.value, dtype=torch.float32, device=device)
            self.inverse = torch.full((), 1.0 / self.value, dtype=torch.float32, device=device)

    def set(self, value: float, device_done: bool = False) -> None:
        """Set the scale (`device_done`: the device tensors already hold it)."""
        if value != self.value:
            self.value = value
            if self.tensor is not None and not device_done:
                self.tensor.fill_(value)
                self.inverse.fill_(1.0 / value)

    def replace(self, new_scale: float | torch.Tensor) -> None:
        """Set the scale to `new_scale` (`GradScaler.update`'s argument), rounded to float32.

        Raises:
            ValueError: new_scale is not a finite number > 0 or a one-element tensor holding one.
        """
        if isinstance(new_scale, torch.Tensor):
            if new_scale.numel() != 1:
                raise ValueError(
                    f"new_scale must be a number or a one-element tensor, got shape {tuple(new_scale.shape)}"
                )
            new_scale = float(new_scale.item())
        self.catch_up()
        self.set(f32(positive("new_scale", new_scale)))

    def update_on_host(self, skipped: bool) -> None:
        """Apply the update rule for a step whose overflow flag the host has read."""
        self.catch_up()
        self._grow_or_back_off(skipped)
        if self.tracker_tensor is not None:
            self.tracker_tensor.fill_(self.tracker)

    def update_on_device(self, outcomes: list) -> None:
        """Back off or grow the device scale from this step's flags, without a host read."""
        scale = self.tensor
        flags = [o if isinstance(o, torch.Tensor) else torch.full((), float(o), device=scale.device) for o in outcomes]
        found = flags[0] if len(flags) == 1 else torch.stack(flags).amax(dim=0)
        if self.tracker_tensor is None:
            self.tracker_tensor = torch.full((), self.tracker, dtype=torch.int32, device=scale.device)
        torch._amp_update_scale_(
            scale, self.tracker_tensor, found, self.growth_factor, self.backoff_factor, self.growth_interval
        )
        torch.reciprocal(scale, out=self.inverse)
        self.unread.append(found)
        if len(self.unread) >= CATCH_UP_STEPS:
            self.catch_up()

    def catch_up(self) -> None:
        """Replay the device-decided steps on the host's view (one host read for all of them)."""
        if not self.unread:
            return
        flags = torch.cat([flag.reshape(1) for flag in self.unread]).tolist()
        self.unread = []
        for found in flags:
            self._grow_or_back_off(found != 0, device_done=True)

    def _grow_or_back_off(self, skipped: bool, device_done: bool = False) -> None:
        """torch's update rule on the host's view (`device_done`: the device scale is already updated)."""
        self.last_skipped = skipped
        if skipped:
            self.skipped += 1
            self.tracker = 0
            self.set(f32(self.value * self.backoff_factor), device_done)
            return
        self.tracker += 1
        if self.tracker == self.growth_interval:
            self.tracker = 0
            grown = f32(self.value * self.growth_factor)
            if math.isfinite(grown):  # as torch: a scale that would overflow float32 stays
                self.set(grown, device_done)

    def state_dict(self) -> dict[str, Any]:
        """torch.amp.GradScaler's state dict plus `skipped_steps`, caught up first."""
        self.catch_up()
        return {
            "scale": self.value,
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "_growth_tracker": self.tracker,
            "skipped_steps": self.skipped,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from `checked_state`, on the host and on the device."""
        self.growth_factor = float(state["growth_factor"])
        self.backoff_factor = float(state["backoff_factor"])
        self.growth_interval = state["growth_interval"]
        self.unread = []  # what the device decided since is replaced by the state loaded
        self.tracker = state["_growth_tracker"]
        self.skipped = state["skipped_steps"]
        self.value = f32(float(state["scale"]))
        if self.tensor is not None:  # always: the device scale may differ from the host's last view
            self.tensor.fill_(self.value)
            self.inverse.fill_(1.0 / self.value)
        if self.tracker_tensor is not None:
            self.tracker_tensor.fill_(self.tracker)
