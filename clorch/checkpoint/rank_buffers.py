"""Buffers that differ between ranks, saved once per rank in a sharded checkpoint.

A sharded model's parameters are one tensor split over the ranks, but its
buffers are each rank's own: BatchNorm's running statistics follow each rank's
micro-batches (nothing broadcasts them, as DDP does). DCP keeps one copy of a
tensor every rank holds under the same name, so a resume would hand every rank
that one copy. `save_sharded` therefore compares the ranks' buffers (a digest
each, in its first all-gather) and saves those that differ once per rank as
well, under `RANK_BUFFERS.<rank>.<name>`; clorch.json lists their names. A
resume on the same world size gives each rank its own again; on another world
size no rank's own statistics exist, and the common copy is loaded.
"""

from __future__ import annotations

from typing import Any

import torch
import xxhash
from torch.distributed.tensor import DTensor

RANK_BUFFERS = "rank_buffers"
"""The top-level key of the per-rank copies in DCP's state dict."""


def buffer_digests(model_state: dict[str, Any]) -> dict[str, str]:
    """Name -> digest of the bytes of every rank-local tensor (not a DTensor: not sharded) of a state dict."""
    digests = {}
    for name, value in model_state.items():
        if isinstance(value, torch.Tensor) and not isinstance(value, DTensor):
            raw = value.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy()
            digests[name] = xxhash.xxh3_128_hexdigest(raw.tobytes()) + str(value.dtype)
    return digests


def differing(per_rank: list[dict[str, str]]) -> list[str]:
    """The names whose digests are not the same on every rank, sorted."""
    names = set().union(*per_rank) if per_rank else set()
    return sorted(name for name in names if len({digests.get(name) for digests in per_rank}) > 1)


def own_copies(model_state: dict[str, Any], names: list[str], rank: int) -> dict[str, Any]:
    """`{RANK_BUFFERS: {rank: {name: tensor}}}` to save beside the model's state (nothing when `names` is empty)."""
    return {RANK_BUFFERS: {str(rank): {name: model_state[name] for name in names}}} if names else {}


def empty_copies(model_state: dict[str, Any], names: list[str], rank: int) -> dict[str, Any]:
    """Tensors for DCP to fill with this rank's saved copies (as `own_copies` keyed them)."""
    if not names:
        return {}
    return {RANK_BUFFERS: {str(rank): {name: torch.empty_like(model_state[name]) for name in names}}}
