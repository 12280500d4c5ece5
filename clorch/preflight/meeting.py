"""Meetings of the ranks in the rendezvous store, each with a deadline that names who is missing.

torch's `monitored_barrier` names a missing rank, but on gloo only; a plain
barrier on nccl just hangs for the group's timeout. The preflight instead
meets through the job's TCPStore, which every backend has: each rank posts
its value under the meeting's key and counts itself in; the rank that
completes the count declares the meeting full. A rank that waits past the
deadline declares the ranks whose values are absent missing. Both
declarations go through one `compare_set` on the same key, so the first one
wins and every rank, a late one included, reads the same outcome.

Rank 0 hosts the store (clorch's launcher and torchrun alike, unless the
elastic agent hosts it): when it leaves, the store goes with it, so rank 0
waits for the others to say they have read what they need (`leave`).
"""

from __future__ import annotations

import datetime as _dt
import json
import time

import torch.distributed as dist

_POLL_S = 0.005


class StoreUnreachable(RuntimeError):
    """The rendezvous store did not answer: the rank hosting it (rank 0) is gone."""


def _delta(seconds: float) -> _dt.timedelta:
    return _dt.timedelta(seconds=max(seconds, 0.001))


def meet(store: dist.Store, key: str, rank: int, world_size: int, value: str, timeout_s: float) -> list[int]:
    """Post `value` for this rank and wait for every rank's; return the ranks missing ([] if none).

    Every rank of the group calls it with the same `key`. It blocks until all
    `world_size` ranks have posted, or `timeout_s` seconds. A rank that comes
    after the others gave up returns at once, itself among the missing.

    Raises:
        StoreUnreachable: the store stopped answering.
    """
    outcome = f"{key}/outcome"
    try:
        store.set(f"{key}/value/{rank}", value)
        if store.check([outcome]):  # the others already gave up on this meeting
            return json.loads(store.get(outcome))
        if store.add(f"{key}/count", 1) == world_size:
            store.compare_set(outcome, "", "[]")
        try:
            store.wait([outcome], _delta(timeout_s))
        except dist.DistStoreError:  # the deadline passed: declare the missing, unless another rank did
            missing = [r for r in range(world_size) if not store.check([f"{key}/value/{r}"])]
            store.compare_set(outcome, "", json.dumps(missing))
        return json.loads(store.get(outcome))
    except RuntimeError as exc:
        raise StoreUnreachable(
            f"cannot reach the rendezvous store it hosts (rank 0 has left or died; "
            f"it leaves when the others gave up on this rank): {exc}"
        ) from exc


def values(store: dist.Store, key: str, ranks: list[int]) -> dict[int, str]:
    """The values `ranks` posted to the meeting `key` (all of them must have posted)."""
    if not ranks:
        return {}
    got = store.multi_get([f"{key}/value/{r}" for r in ranks])
    return {r: v.decode() for r, v in zip(ranks, got)}


def post(store: dist.Store, key: str, value: str) -> None:
    """Set `key`; a store that is gone is not an error here (the caller is only leaving a trace)."""
    try:
        store.set(key, value)
    except RuntimeError:
        pass


def read_if_posted(store: dist.Store, key: str) -> str | None:
    """The value of `key`, or None when it was never set or the store is gone."""
    try:
        return store.get(key).decode() if store.check([key]) else None
    except RuntimeError:
        return None


def wait_posted(store: dist.Store, key: str, timeout_s: float) -> str | None:
    """The value of `key` once set, or None after `timeout_s` seconds or when the store is gone."""
    try:
        store.wait([key], _delta(timeout_s))
        return store.get(key).decode()
    except RuntimeError:
        return None


def leave(store: dist.Store, key: str, rank: int, expected: int, timeout_s: float) -> None:
    """Say this rank is done with the store; rank 0 (its host) waits for `expected` ranks to say so.

    Without the wait, rank 0 could return (and, in `preflight=only`, exit and
    take the store down) before a slower rank has read the verdict.
    """
    try:
        count = store.add(f"{key}/left", 1)
        if rank != 0:
            return
        deadline = time.monotonic() + timeout_s
        while count < expected and time.monotonic() < deadline:
            time.sleep(_POLL_S)
            count = store.add(f"{key}/left", 0)
    except RuntimeError:
        pass  # a rank that cannot reach the store has nothing left to read from it
