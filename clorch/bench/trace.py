"""A profiler trace of one training step, and how much of its communication is exposed.

`profile_step(run_step, path)` records one step with torch.profiler (CUDA
kernels on CUDA, operators on CPU), writes a Chrome trace (gzip) and returns
the figures of `kernel_overlap`: how long communication kernels ran, how long
they ran with no other kernel running ("exposed": nothing hides it), and how
long the device was busy at all.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterable

import torch
from torch.profiler import ProfilerActivity, profile

COMM_MARKERS = ("nccl", "allreduce", "all_reduce")
DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")  # trace categories that occupy the device


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _length(intervals: Iterable[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _minus(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of the union `a` not covered by the union `b` (both sorted, disjoint)."""
    total, j = 0.0, 0
    for start, end in a:
        cursor = start
        while j < len(b) and b[j][1] <= cursor:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cursor:
                total += b[k][0] - cursor
            cursor = max(cursor, b[k][1])
            k += 1
        total += max(0.0, end - cursor)
    return total


def kernel_overlap(events: list[dict]) -> dict[str, float]:
    """Microseconds of communication, of exposed communication and of busy device in a Chrome trace.

    Device work is the trace's "kernel" events and its device memory copies and
    fills ("gpu_memcpy", "gpu_memset": `copy_` between contiguous tensors is a
    memcpy, not a kernel; host-to-device copies and NCCL's own memcpys count
    as compute too); it is communication when its name holds one of
    `COMM_MARKERS`.
    """
    comm, other = [], []
    for event in events:
        if event.get("cat") not in DEVICE_WORK or "dur" not in event:
            continue
        span = (float(event["ts"]), float(event["ts"]) + float(event["dur"]))
        name = event.get("name", "").lower()
        (comm if any(marker in name for marker in COMM_MARKERS) else other).append(span)
    comm_u, other_u = _union(comm), _union(other)
    return {
        "comm_us": _length(comm_u),
        "exposed_comm_us": _minus(comm_u, other_u),
        "compute_us": _length(other_u),
        "busy_us": _length(_union(comm + other)),
    }


def profile_step(run_step: Callable[[], object], path: Path) -> dict[str, float]:
    """Profile one call of `run_step` (after the caller's warm-up); write `path` (.json.gz).

    Local to the calling rank, but `run_step` usually holds collectives: every
    rank must profile the same step.
    """
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        run_step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, raw = tempfile.mkstemp(suffix=".json", dir=path.parent)
    os.close(fd)
    try:
        prof.export_chrome_trace(raw)
        data = Path(raw).read_bytes()
    finally:
        os.unlink(raw)
    with gzip.open(path, "wb") as out:
        out.write(data)
    return kernel_overlap(json.loads(data).get("traceEvents", []))
