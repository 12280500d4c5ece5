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

import torch
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


def check_all_to_all_splits(input_splits: list[int], output_splits: list[int]) -> None:
    """Check that rank i's output_split_sizes[j] equals rank j's input_split_sizes[i]. All ranks call.

    Each rank's splits may differ (that is the point of all_to_all), so they are
    gathered and checked as a matrix instead of compared for equality; a
    mismatch would otherwise abort the backend or hang.

    Raises:
        CollectiveMismatchError: on every rank, naming the first pair of ranks that disagree.
    """
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (list(input_splits), list(output_splits)))
    for receiver, (_, outputs) in enumerate(everyone):
        for sender, (inputs, _) in enumerate(everyone):
            if outputs[sender] != inputs[receiver]:
                raise CollectiveMismatchError(
                    f"collective mismatch across ranks: all_to_all_single: rank {sender} sends "
                    f"{inputs[receiver]} rows to rank {receiver} (input_split_sizes={inputs}), but rank "
                    f"{receiver} expects {outputs[sender]} from it (output_split_sizes={outputs})"
                )


_P2P_SLOTS = 12  # dtype code, ndim, then up to 10 dims: a fixed-size message, so no size can hang
_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.complex64,
    torch.complex128,
]


def _p2p_fingerprint(tensor: torch.Tensor) -> torch.Tensor:
    code = _DTYPES.index(tensor.dtype) if tensor.dtype in _DTYPES else -1
    shape = list(tensor.shape)[: _P2P_SLOTS - 2]
    values = [code, tensor.dim(), *shape] + [0] * (_P2P_SLOTS - 2 - len(shape))
    return torch.tensor(values, dtype=torch.int64, device=tensor.device)


def _describe_p2p(fingerprint: list[int]) -> str:
    code, ndim = fingerprint[0], fingerprint[1]
    dtype = str(_DTYPES[code]).replace("torch.", "") if 0 <= code < len(_DTYPES) else "other"
    return f"shape={tuple(fingerprint[2 : 2 + ndim])}, dtype={dtype}"


def check_send(tensor: torch.Tensor, dst: int) -> None:
    """Before `send`: exchange fingerprints with rank `dst` (which calls `check_recv`).

    Raises:
        CollectiveMismatchError: on both ranks, when shape or dtype differ.
    """
    mine = _p2p_fingerprint(tensor)
    dist.send(mine, dst)
    theirs = mine.clone()
    dist.recv(theirs, dst)
    if not bool((theirs == mine).all()):
        raise _p2p_error(dist.get_rank(), mine.tolist(), dst, theirs.tolist())


def check_recv(tensor: torch.Tensor, src: int) -> None:
    """Before `recv`: receive rank `src`'s fingerprint, answer with ours, compare. See check_send."""
    mine = _p2p_fingerprint(tensor)
    theirs = mine.clone()
    dist.recv(theirs, src)
    dist.send(mine, src)
    if not bool((theirs == mine).all()):
        raise _p2p_error(src, theirs.tolist(), dist.get_rank(), mine.tolist())


def _p2p_error(sender: int, sent: list[int], receiver: int, expected: list[int]) -> CollectiveMismatchError:
    return CollectiveMismatchError(
        f"collective mismatch: rank {sender} sends a tensor of {_describe_p2p(sent)} to rank {receiver}, "
        f"which receives into {_describe_p2p(expected)}"
    )
