"""The exposed-communication arithmetic of `clorch-bench ddp --trace`, on hand-made kernel events."""

from __future__ import annotations

import pytest

from clorch.bench.trace import kernel_overlap

pytestmark = pytest.mark.timeout(30)


def _kernel(name, ts, dur):
    return {"cat": "kernel", "name": name, "ts": ts, "dur": dur}


def test_exposed_is_communication_with_no_other_kernel_running():
    events = [
        _kernel("ampere_sgemm", 0, 10),
        _kernel("ncclDevKernel_AllReduce_Sum_f32", 5, 20),
        _kernel("elementwise", 12, 3),
        _kernel("ncclDevKernel_AllReduce_Sum_f32", 40, 5),
        _kernel("vectorized_add", 42, 10),
        {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 99},
    ]
    got = kernel_overlap(events)
    # comm: [5, 25) and [40, 45) = 25; compute: [0, 10), [12, 15), [42, 52) = 23
    # exposed: [10, 12) + [15, 25) + [40, 42) = 14; busy: [0, 25) + [40, 52) = 37
    assert got == {"comm_us": 25.0, "exposed_comm_us": 14.0, "compute_us": 23.0, "busy_us": 37.0}


def test_no_kernels_gives_zeros():
    assert kernel_overlap([]) == {"comm_us": 0.0, "exposed_comm_us": 0.0, "compute_us": 0.0, "busy_us": 0.0}


def test_device_memory_copies_count_as_device_work():
    events = [
        _kernel("ampere_sgemm", 0, 10),
        {"cat": "gpu_memcpy", "name": "Memcpy DtoD", "ts": 10, "dur": 4},
        {"cat": "gpu_memset", "name": "Memset (Device)", "ts": 20, "dur": 1},
    ]
    assert kernel_overlap(events) == {"comm_us": 0.0, "exposed_comm_us": 0.0, "compute_us": 15.0, "busy_us": 15.0}
