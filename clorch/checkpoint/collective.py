"""The two synchronization points of saving and loading: exchange, then agree.

Both turn a failure on one rank into an error on every rank, so that no rank
is left waiting in a collective that a failed peer will never join.
Outside an initialized process group (or in a world of one) they are local.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from clorch.checkpoint.archive import CheckpointError
import clorch.distributed as cdist


def _all_gather(obj: Any) -> list[Any]:
    if not cdist.is_initialized() or cdist.world_size() == 1:
        return [obj]
    out: list[Any] = [None] * cdist.world_size()
    dist.all_gather_object(out, obj)
    return out


def _summary(error: BaseException | None) -> str | None:
    return None if error is None else f"{type(error).__name__}: {error}"


def exchange(local: Any, error: BaseException | None, action: str) -> list[Any]:
    """Give every rank every rank's `local` value, unless some rank failed to produce one.

    Collective: every rank of the group must call it, in the same order
    relative to other collectives; it blocks until all ranks have arrived.

    Raises:
        error: this rank's own error, re-raised.
        CheckpointError: another rank reported an error (its rank and message).
        RuntimeError: the process group failed (a peer died, a timeout).
    """
    gathered = _all_gather((None if error is not None else local, _summary(error)))
    if error is not None:
        raise error
    for rank, (_, message) in enumerate(gathered):
        if message is not None:
            raise CheckpointError(f"rank {rank} failed to {action}: {message}")
    return [value for value, _ in gathered]


def agree(error: BaseException | None, action: str) -> None:
    """Wait for every rank, then raise on all of them if any failed.

    Collective, blocking and raising as `exchange`; doubles as the barrier at
    which other ranks wait for rank 0's write.
    """
    exchange(None, error, action)
