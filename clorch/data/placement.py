"""Placing a task's tensors on the training device once, instead of copying every batch.

A task holds its whole split as tensors (see `clorch.data.base`). On a GPU,
gathering each batch on the host, pinning it and copying it over costs host
time on every micro-batch; when the split is small enough, `place_task` moves
its tensors to the device once and every batch is gathered there.
"""

from __future__ import annotations

import torch

DEVICE_DATA_LIMIT_BYTES = 2 * 1024**3
"""Splits larger than this stay on the host (batches are then pinned and copied)."""


def place_task(task: object, device: torch.device, limit_bytes: int = DEVICE_DATA_LIMIT_BYTES) -> bool:
    """Move every tensor attribute of `task` to `device` when together they fit `limit_bytes`.

    Local (no collective). A task on the CPU, or one larger than the limit,
    is left as it is.

    Returns:
        True when the tensors were moved (the task's batches are then on `device`).
    """
    if device.type == "cpu":
        return False
    task = getattr(task, "inner", task)  # a SteppedTask's tensors are its built-in task's
    tensors = {name: value for name, value in vars(task).items() if isinstance(value, torch.Tensor)}
    if not tensors or sum(t.numel() * t.element_size() for t in tensors.values()) > limit_bytes:
        return False
    for name, tensor in tensors.items():
        setattr(task, name, tensor.to(device))
    return True
