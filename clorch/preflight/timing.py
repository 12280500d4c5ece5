"""Timed measurements: a GEMM, a checkpoint-sized write, and waits with a deadline.

Each function measures one thing on this rank and returns a number; comparing
ranks is `clorch.preflight.report`'s job.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import statistics
import time
from pathlib import Path

import torch

_POLL_S = 0.0005  # between checks of an unfinished collective: well under the shortest one timed


class DeadlineExceeded(RuntimeError):
    """A wait of the preflight passed its deadline."""


MIN_TIMING_S = 0.02  # work per timing: a timer's resolution and one interrupt stay below 1% of it


def matmul_tflops(n: int, device: torch.device, repeats: int) -> float:
    """TFLOP/s of n x n multiplies: the median of `repeats` timings (bf16 on a GPU, fp32 on the CPU).

    Each timing runs as many multiplies as fill `MIN_TIMING_S`, counted from
    an untimed warm-up (which also loads the kernels and ramps a GPU's
    clocks); the median of the timings is robust to a few disturbed ones.

    On a GPU a timing is the device's own time (CUDA events). On the CPU it
    is one core's speed: the multiplies run on one thread and are timed in
    that thread's CPU time. Ranks of one host share its cores, and wall time
    would measure the share the scheduler gave a rank at that moment (6x
    apart for two healthy ranks of a busy 2-core host); a thread's CPU time
    does not run while it waits for a core, so what it measures is the core:
    a throttled, slower or misconfigured CPU still shows.
    """
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    threads = torch.get_num_threads()
    if device.type != "cuda":
        torch.set_num_threads(1)
    try:
        _timed(a, b, 1)  # the first multiply loads kernels and allocates workspace: not timed
        count = max(1, math.ceil(MIN_TIMING_S / max(_timed(a, b, 1), 1e-9)))
        _timed(a, b, count)  # warm-up at full length (a GPU's clocks ramp up)
        seconds = statistics.median(_timed(a, b, count) for _ in range(repeats)) / count
    finally:
        if device.type != "cuda":
            torch.set_num_threads(threads)
    return 2.0 * n**3 / max(seconds, 1e-12) / 1e12


def _timed(a: torch.Tensor, b: torch.Tensor, count: int) -> float:
    """Seconds of `count` multiplies a @ b: CUDA events on a GPU, this thread's CPU time otherwise."""
    if a.device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(count):
            torch.matmul(a, b)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    begin = time.thread_time()
    for _ in range(count):
        torch.matmul(a, b)
    return time.thread_time() - begin


WRITES = 3  # timed writes; their median counts, so one stall behind another writer's flush does not


def write_mb_per_s(directory: Path, nbytes: int, name: str) -> float:
    """MB/s of writing `nbytes` to a new file in `directory` and fsyncing it: the median of
    `WRITES` such writes; the file is removed.

    Raises:
        OSError: the directory cannot be written (the caller names the rank and the path).
    """
    path = directory / name
    block = os.urandom(min(nbytes, 4 << 20))  # random bytes: a compressing filesystem cannot cheat
    times = []
    try:
        for _ in range(WRITES):
            begin = time.perf_counter()
            with open(path, "wb") as handle:
                left = nbytes
                while left > 0:
                    left -= handle.write(block[:left])
                handle.flush()
                os.fsync(handle.fileno())
            times.append(time.perf_counter() - begin)
    finally:
        path.unlink(missing_ok=True)
    return nbytes / max(statistics.median(times), 1e-9) / 1e6


def wait_for(work: object, deadline: float, what: str, blocking: bool) -> None:
    """Wait for an async collective's `work` until `deadline` (time.monotonic()).

    Never waits for the whole group's timeout (600 s by default) on a hung
    peer. `blocking` (for gloo) waits in `work.wait(timeout)`: gloo's
    send/receive work reports completion only from inside `wait`. Otherwise
    (NCCL) it polls `is_completed()`, which asks the work's CUDA event, where
    NCCL's `wait(timeout)` would abort the communicator at the deadline.

    Raises:
        DeadlineExceeded: `what` did not finish in time.
        RuntimeError: the backend's error (a peer left the group).
    """
    if blocking:
        try:
            work.wait(_dt.timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
        except RuntimeError as exc:
            if time.monotonic() >= deadline:
                raise DeadlineExceeded(f"{what} did not finish within preflight.timeout_s") from exc
            raise
        return
    while not work.is_completed():
        if time.monotonic() > deadline:
            raise DeadlineExceeded(f"{what} did not finish within preflight.timeout_s")
        time.sleep(_POLL_S)
    work.wait()


def bus_gb_per_s(nbytes: int, seconds: float, world_size: int) -> float:
    """All-reduce bus bandwidth in GB/s: the algorithm bandwidth times 2(n-1)/n.

    The factor makes the figure comparable across group sizes and with the
    link's own bandwidth, as nccl-tests report it.
    """
    return nbytes / max(seconds, 1e-12) * 2.0 * (world_size - 1) / world_size / 1e9
