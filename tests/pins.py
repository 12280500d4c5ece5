"""Pinned weights digests, per machine: what a job trained at a known-good commit, bit for bit.

A CPU's kernels (AVX2 or AVX-512 paths in ATen, oneDNN and MKL) round differently, so
one job trains other bits on another kind of CPU; a pin holds on the kind of machine it
was taken on. `check_pinned` passes when the digests equal a pin of this machine's kind,
fails when this kind has a pin and they differ (a change moved the bits), and skips on a
kind of machine without one, saying how to add it: run the job at the commit the pin names
and add its digests under `machine_kind()`.
"""

from __future__ import annotations

import platform

import pytest
import torch


def machine_kind() -> str:
    """The CPU as its kernels see it: the instruction set torch dispatches to, and the model name."""
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{torch.backends.cpu.get_cpu_capability()} {model}"


def check_pinned(got: dict[str, str], pins: dict[str, dict[str, str]], commit: str) -> None:
    """Assert `got` equals the pin of this machine's kind (`pins`: kind -> digests); skip without one."""
    kind = machine_kind()
    if kind not in pins:
        pytest.skip(f"no pinned digests for a {kind!r} CPU: run this test at {commit} there and pin {got}")
    assert got == pins[kind], f"on a {kind!r} CPU"
