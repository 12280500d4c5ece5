"""Rank 0's buffers for a while: `with rank0_buffers(model): evaluate(model)`.

Buffers (BatchNorm's running statistics) are not gradients: each rank's
forwards update its own. With `broadcast_buffers=True`, DDP hands every rank
rank 0's buffers at the start of each forward, but the last training forward
still leaves each rank with its own update; with `broadcast_buffers=False`
they drift apart for the whole run. Rank 0's model is the one a checkpoint
and an export hold, so evaluation runs on rank 0's buffers on every rank.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

from clorch.nn.parallel.signature import broadcast_coalesced


@contextlib.contextmanager
def rank0_buffers(module: nn.Module, world_size: int) -> Iterator[None]:
    """Inside, every rank's `module` holds rank 0's buffers; after, each rank's own again.

    Collective when `world_size` > 1 and the module has buffers: every rank
    must enter it with the same module structure. Entering broadcasts from
    rank 0 (one broadcast per dtype and device; blocks until the values may be
    read; raises what the collective raises); leaving is local. Parameters are
    untouched: DDP keeps them equal on every rank.
    """
    buffers = [b for b in module.buffers()]
    if world_size <= 1 or not buffers:
        yield
        return
    own = [b.detach().clone() for b in buffers]
    broadcast_coalesced(buffers)
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, saved in zip(buffers, own):
                buffer.copy_(saved)
