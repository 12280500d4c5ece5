"""Collective fingerprints: catch mismatched calls across ranks instead of hanging.

With CLORCH_DEBUG_COLLECTIVES=1 (or `process_group(debug=True)`) every
collective first gathers a small description of the call from all ranks:
which collective, shapes, dtype, op, root. Gathering the descriptions is
itself a fixed-size protocol that every rank runs identically, so it cannot
deadlock on the mismatch it is looking for. Costs one extra round trip per
collective: a debugging aid, not for production runs.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist


class CollectiveMismatchError(RuntimeError):
    """Ranks called different collectives, or the same one with incompatible arguments."""


def _describe(fingerprint: dict[str, Any]) -> str:
    name = fingerprint["collective"]
    args = ", ".join(f"{k}={v}" for k, v in fingerprint.items() if k != "collective")
    return f"{name}({args})"


def check_fingerprint(collective: str, **details: Any) -> None:
    """Compare this call's fingerprint with every other rank's. All ranks call.

    Raises:
        CollectiveMismatchError: on every rank, naming which ranks disagree and how.
    """
    mine = {"collective": collective, **details}
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    groups: dict[str, list[int]] = {}
    for rank, fingerprint in enumerate(everyone):
        groups.setdefault(_describe(fingerprint), []).append(rank)
    if len(groups) > 1:
        lines = "; ".join(f"ranks {ranks} called {call}" for call, ranks in groups.items())
        raise CollectiveMismatchError(f"collective mismatch across ranks: {lines}")
