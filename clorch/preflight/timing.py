"""Timed measurements: a GEMM, a checkpoint-sized write, and waits with a deadline.

Each function measures one thing on this rank and returns a number; comparing
ranks is `clorch.preflight.report`'s job.
"""

from __future__ import annotations

import datetime as _dt
import os
import time
from pathlib import Path

import torch

_POLL_S = 0.0005  # between checks of an unfinished collective: well under the shortest one timed


class DeadlineExceeded(RuntimeError):
    """A wait of the preflight passed its deadline."""


def matmul_tflops(n: int, device: torch.device, repeats: int) -> float:
    """TFLOP/s of the fastest of `repeats` n x n multiplies (bf16 on a GPU, fp32 on the CPU).

    One untimed multiply first warms the kernels (and a GPU's clocks). The
    fastest run counts, so a moment of scheduling noise on a shared host does
    not make a healthy rank look slow; a throttled or degraded device is slow
    on every run.
    """
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    torch.matmul(a, b)
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.matmul(a, b)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            begin = time.perf_counter()
            torch.matmul(a, b)
            seconds = time.perf_counter() - begin
        best = min(best, seconds)
    return 2.0 * n ** 3 / max(best, 1e-12) / 1e12


def write_mb_per_s(directory: Path, nbytes: int, name: str) -> float:
    """MB/s of writing `nbytes` to a new file in `directory` and fsyncing it; the file is removed.

    Raises:
        OSError: the directory cannot be written (the caller names the rank and the path).
    """
    path = directory / name
    block = os.urandom(min(nbytes, 4 << 20))  # random bytes: a compressing filesystem cannot cheat
    begin = time.perf_counter()
    try:
        with open(path, "wb") as handle:
            left = nbytes
            while left > 0:
                left -= handle.write(block[:left])
            handle.flush()
            os.fsync(handle.fileno())
        seconds = time.perf_counter() - begin
    finally:
        path.unlink(missing_ok=True)
    return nbytes / max(seconds, 1e-9) / 1e6


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
