"""Checks the ranks run on each other: all-reduce bus bandwidth, the nodes' leaders, a neighbour round trip.

Every rank of the default group calls `make_groups` as soon as the arrival
meeting found them all present, and `group_checks` after its local checks. The collectives run
on private groups made for
the preflight, each collective waited for with its own deadline
(`timing.wait_for`), so a hung or dead peer ends a rank's group checks with a
failure line instead of a wait of the job's collective timeout. After the first
failure a rank runs no more collectives: its peers find the same failure at
their own deadline, and the result meeting names the rank that hung.
"""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from clorch.preflight import timing
from clorch.preflight.options import PreflightConfig

MIB = 1 << 20


def leaders(hosts: list[str]) -> list[int]:
    """The lowest rank of each host, in rank order: the ranks that speak for their node."""
    first: dict[str, int] = {}
    for rank, host in enumerate(hosts):
        first.setdefault(host, rank)
    return sorted(first.values())


# gloo connects a new group's pairs within the group's timeout, and a connect that times out can
# take the process down (seen: SIGSEGV after "connectFullMesh failed ... Connect timeout" with
# preflight.timeout_s=0.001). Every wait on these groups has the preflight's own deadline
# (timing.wait_for), so connecting gets at least this long and the deadlines stay the preflight's.
GLOO_CONNECT_FLOOR_S = 10.0


def _new_group(ranks: list[int] | None, backend: str, timeout_s: float) -> Any:
    # NCCL's watchdog takes the whole process down at the group's timeout: give it several times
    # the preflight's, so that the ranks first report through the store who hung.
    seconds = max(timeout_s, GLOO_CONNECT_FLOOR_S) if backend == "gloo" else 4 * timeout_s + 60
    return dist.new_group(ranks, timeout=_dt.timedelta(seconds=seconds), backend=backend)


def _allreduce_busbw(
    group: Any,
    size: int,
    device: torch.device,
    sizes_mb: list[int],
    iters: int,
    timeout_s: float,
    what: str,
    stage: Callable[[str], None],
) -> dict[int, float]:
    """Bus bandwidth (GB/s) of an all-reduce over `group` (of `size` ranks) at each size."""
    out = {}
    for mb in sizes_mb:
        label = f"all_reduce of {mb} MiB over {what}"
        stage(label)
        tensor = torch.ones(mb * MIB // 4, dtype=torch.float32, device=device)
        timing.wait_for(
            dist.all_reduce(tensor, group=group, async_op=True),
            time.monotonic() + timeout_s,
            label,
            device.type != "cuda",
        )  # warm-up: connections, buffers
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        deadline = time.monotonic() + timeout_s
        begin = time.perf_counter()
        works = [dist.all_reduce(tensor, group=group, async_op=True) for _ in range(iters)]
        for work in works:
            timing.wait_for(work, deadline, label, device.type != "cuda")
        out[mb] = timing.bus_gb_per_s(mb * MIB, (time.perf_counter() - begin) / iters, size)
    return out


def _round_trip_ms(
    group: Any,
    rank: int,
    world_size: int,
    device: torch.device,
    mb: int,
    timeout_s: float,
    stage: Callable[[str], None],
) -> float:
    """Milliseconds to send `mb` MiB to the next rank and have it echoed back from there.

    Each leg is a batched send + receive (`batch_isend_irecv`), which NCCL needs
    to pair two ranks that send to each other at once; gloo takes it too.
    """
    nxt, prv = (rank + 1) % world_size, (rank - 1) % world_size
    label = f"round trip of {mb} MiB to rank {nxt} and back"
    stage(label)
    sent = torch.randn(mb * MIB // 4, device=device)
    passing, echo = torch.empty_like(sent), torch.empty_like(sent)
    deadline = time.monotonic() + timeout_s
    begin = time.perf_counter()
    for send, dst, recv, src in ((sent, nxt, passing, prv), (passing, prv, echo, nxt)):
        works = dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, send, dst, group=group), dist.P2POp(dist.irecv, recv, src, group=group)]
        )
        for work in works:
            timing.wait_for(work, deadline, label, device.type != "cuda")
    elapsed = time.perf_counter() - begin
    if not torch.equal(echo, sent):
        raise RuntimeError(f"{label}: the data came back changed")
    return elapsed * 1e3


def failure_line(doing: str, exc: RuntimeError) -> str:
    """One line for a failed group check: what was running, and the backend's first line."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, timing.DeadlineExceeded):
        return text
    if "timeout" in text.lower() or "timed out" in text.lower():  # gloo's own deadline (= the preflight's)
        return f"{doing} did not finish within preflight.timeout_s ({text})"
    return f"{doing} failed: {text}"


@dataclass
class PreflightGroups:
    """The preflight's own process groups: all ranks, and the nodes' leading ranks (None on one node)."""

    everyone: Any
    heads: list[int]
    heads_group: Any

    def destroy(self) -> None:
        for group in (self.everyone, self.heads_group):
            if group is not None:
                dist.destroy_process_group(group)


def make_groups(hosts: list[str], backend: str, timeout_s: float) -> PreflightGroups | None:
    """Make the preflight's groups (None for a world of one).

    Every rank of the default group must call it, right after all have
    arrived: `dist.new_group` is collective over the default group, and gloo
    connects its ranks there, so a rank that is late to it (busy in a slow
    local check) would fail the others' group before any measurement.

    Raises:
        RuntimeError: the backend could not connect the ranks within `timeout_s`.
    """
    if len(hosts) < 2:
        return None
    heads = leaders(hosts)
    everyone = _new_group(None, backend, timeout_s)
    # Every rank makes the leaders' group too, members or not.
    heads_group = _new_group(heads, backend, timeout_s) if len(heads) > 1 else None
    return PreflightGroups(everyone, heads, heads_group)


def group_checks(
    groups: PreflightGroups | None,
    rank: int,
    world_size: int,
    device: torch.device,
    options: PreflightConfig,
    stage: Callable[[str], None],
) -> dict[str, Any]:
    """Bus bandwidth over all ranks and over the nodes' leaders; the round trip to the next rank.

    Every rank of the default group must call it, with the groups `make_groups`
    returned. Blocks for at most `options.timeout_s` per collective. Raises
    nothing for a peer's fault: the row's "failure" says which collective did
    not finish. The groups are destroyed when every collective finished.
    """
    row: dict[str, Any] = {"busbw_gb_s": None, "internode_busbw_gb_s": None, "p2p_ms": None, "failure": None}
    if groups is None:
        return row
    sizes, timeout, iters = options.sizes_mb(device.type == "cuda"), options.timeout_s, options.allreduce_iters
    doing = [""]

    def step(label: str) -> None:
        doing[0] = label
        stage(label)

    try:
        row["busbw_gb_s"] = _allreduce_busbw(
            groups.everyone, world_size, device, sizes, iters, timeout, f"all {world_size} ranks", step
        )
        # The round trip before the leaders' all-reduce: the other ranks need not wait for it.
        row["p2p_ms"] = _round_trip_ms(groups.everyone, rank, world_size, device, options.p2p_mb, timeout, step)
        if groups.heads_group is not None and rank in groups.heads:
            row["internode_busbw_gb_s"] = _allreduce_busbw(
                groups.heads_group,
                len(groups.heads),
                device,
                sizes,
                iters,
                timeout,
                f"the {len(groups.heads)} nodes' leading ranks {groups.heads}",
                step,
            )
    except RuntimeError as exc:  # DeadlineExceeded, or the backend's error (a peer left, gloo's timeout)
        row["failure"] = failure_line(doing[0], exc)
        return row  # the groups stay: destroying one with a collective in flight can hang
    groups.destroy()
    return row
