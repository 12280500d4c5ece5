"""The two synchronization points of saving and loading: exchange, then agree.

Both turn a failure on one rank into an error on every rank, so that no rank
is left waiting in a collective that a failed peer will never join.
Outside an initialized process group (or in a world of one) they are local.

A rank that never arrives (the torch habit `if rank == 0: save(...)`, or a
rank that died) cannot be told apart from a slow one: the others wait until
the group's collective timeout, then (on gloo) raise an error that says that
every rank must call. On NCCL, torch's watchdog usually ends the process at
the timeout instead, with its own log. In debug mode
(CLORCH_DEBUG_COLLECTIVES=1) each synchronization point first compares
fingerprints, so a rank that is in another clorch collective meanwhile (the
next step's gradient all-reduce of clorch's DDP, say) is named at once, on
every rank.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from clorch.checkpoint.archive import CheckpointError
import clorch.distributed as cdist
from clorch.distributed.collectives import failure_like
from clorch.distributed.debug import CollectiveMismatchError, check_fingerprint
from clorch.distributed.groups import debug_enabled


def _all_gather(obj: Any, call: str, action: str) -> list[Any]:
    if not cdist.is_initialized() or cdist.world_size() == 1:
        return [obj]
    out: list[Any] = [None] * cdist.world_size()
    try:
        if debug_enabled():
            check_fingerprint(call)
        dist.all_gather_object(out, obj)
    except CollectiveMismatchError:
        raise
    except RuntimeError as exc:  # a timeout or a dead peer, as torch.distributed reports it
        raise failure_like(
            exc,
            (
                f"{call}: rank {cdist.rank()} waited for every rank to {action}, and the process group "
                f"failed ({type(exc).__name__}: {exc}). {call} is collective: every rank must call it at "
                "the same point of the program (not only rank 0, under `if rank == 0:`). A rank that "
                "never did, or that died, leaves the others here until the collective timeout; so does "
                "one still busy past it (rank 0 writing a large checkpoint: raise the timeout). HINT: "
                "CLORCH_DEBUG_COLLECTIVES=1 names a rank that called another clorch collective "
                "instead"
            ),
        ) from exc
    return out


def _summary(error: BaseException | None) -> str | None:
    return None if error is None else f"{type(error).__name__}: {error}"


def exchange(local: Any, error: BaseException | None, action: str, call: str = "save_checkpoint") -> list[Any]:
    """Give every rank every rank's `local` value, unless some rank failed to produce one.

    Collective: every rank of the group must call it, in the same order
    relative to other collectives; it blocks until all ranks have arrived.
    `call` names the public function for the error messages and the
    debug-mode fingerprint.

    Raises:
        error: this rank's own error, re-raised.
        CheckpointError: another rank reported an error (its rank and message).
        CollectiveMismatchError: debug mode only: another rank called a different
            clorch collective (on every rank).
        RuntimeError: the process group failed (a peer died, never called, or was
            slower than the timeout); the message says that `call` is collective. The
            backend's class is kept (DistBackendError, say).
    """
    gathered = _all_gather((None if error is not None else local, _summary(error)), call, action)
    if error is not None:
        raise error
    for rank, (_, message) in enumerate(gathered):
        if message is not None:
            raise CheckpointError(f"rank {rank} failed to {action}: {message}")
    return [value for value, _ in gathered]


def agree(error: BaseException | None, action: str, call: str = "save_checkpoint") -> None:
    """Wait for every rank, then raise on all of them if any failed.

    Collective, blocking and raising as `exchange`; doubles as the barrier at
    which other ranks wait for rank 0's write.
    """
    exchange(None, error, action, call)
