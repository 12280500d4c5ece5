"""Cross-rank checks and broadcasts done once when a model is wrapped."""

from __future__ import annotations

import json
from typing import Sequence

import torch

from clorch.distributed import collectives
from clorch.distributed.groups import device as group_device, rank, world_size


def _entries(named_params: Sequence[tuple[str, torch.Tensor]]) -> list[list]:
    return [
        [name, list(p.shape), str(p.dtype).replace("torch.", ""), bool(p.requires_grad)] for name, p in named_params
    ]


def _gather_entries(entries: list[list]) -> list[list[list]]:
    """Every rank's entries, on every rank (two all-gathers: lengths, then padded bytes)."""
    device, size = group_device(), world_size()
    payload = json.dumps(entries).encode()
    lengths = torch.zeros(size, dtype=torch.int64, device=device)
    collectives.all_gather_into(lengths, torch.tensor([len(payload)], dtype=torch.int64, device=device))
    lengths_host = lengths.tolist()
    longest = max(lengths_host)
    mine = torch.zeros(longest, dtype=torch.uint8)
    mine[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    gathered = torch.empty(size * longest, dtype=torch.uint8, device=device)
    collectives.all_gather_into(gathered, mine.to(device))
    rows = gathered.cpu().view(size, longest)
    return [json.loads(bytes(rows[r, : lengths_host[r]].tolist())) for r in range(size)]


def _describe(entry: list | None) -> str:
    if entry is None:
        return "no parameter there"
    name, shape, dtype, requires_grad = entry
    return f"{name!r} shape {tuple(shape)} dtype {dtype} requires_grad={requires_grad}"


def check_signature(named_params: Sequence[tuple[str, torch.Tensor]]) -> None:
    """Check that every rank wraps the same parameters (names, shapes, dtypes, requires_grad, order).

    Every rank of the group must call it; it blocks on two all-gathers.

    Raises:
        ValueError: on every rank, naming the first differing parameter and
            the ranks that differ from rank 0.
    """
    everyone = _gather_entries(_entries(named_params))
    reference = everyone[0]
    longest = max(len(entries) for entries in everyone)
    for position in range(longest):
        ref = reference[position] if position < len(reference) else None
        differing = [
            r for r, entries in enumerate(everyone) if (entries[position] if position < len(entries) else None) != ref
        ]
        if differing:
            theirs = "; ".join(
                f"rank {r} has {_describe(everyone[r][position] if position < len(everyone[r]) else None)}"
                for r in differing
            )
            raise ValueError(
                f"DistributedDataParallel: parameter signatures differ across ranks at parameter "
                f"#{position}: rank 0 has {_describe(ref)}; {theirs}. Ranks {differing} differ from "
                "rank 0; every rank must wrap the same model (names, shapes, dtypes, requires_grad, "
                "in registration order)"
            )


def broadcast_coalesced(tensors: Sequence[torch.Tensor], src: int = 0) -> None:
    """Overwrite `tensors` with rank `src`'s values: one broadcast per (dtype, device).

    Every rank of the group must call it with tensors of the same shapes and
    dtypes in the same order; it blocks until the values may be read (on
    CUDA: until they are ordered on the current stream).
    """
    groups: dict[tuple, list[torch.Tensor]] = {}
    for tensor in tensors:
        # Written through `.data`, which autograd does not track: a forward that saved a buffer
        # for its backward (BatchNorm saves its running stats) must still run that backward after
        # the next forward's broadcast, as with torch's DDP (two forwards, then one backward).
        groups.setdefault((tensor.dtype, tensor.device), []).append(tensor.data)
    with torch.no_grad():
        for members in groups.values():
            if len(members) == 1 and members[0].is_contiguous():
                collectives.broadcast(members[0], src=src)
                continue
            flat = torch.cat([t.reshape(-1) for t in members])
            collectives.broadcast(flat, src=src)
            if rank() != src:  # the source's tensors already hold the values
                views = [v.view_as(t) for v, t in zip(flat.split([t.numel() for t in members]), members)]
                torch._foreach_copy_(members, views)
