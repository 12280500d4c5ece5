"""autocast: casts inside, restores the thread's previous state after (nested, on error)."""

from __future__ import annotations

import pytest
import torch

from clorch.amp import autocast, precision_settings

pytestmark = pytest.mark.timeout(30)


def _state(device):
    return (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device), torch.is_autocast_cache_enabled())


@pytest.mark.parametrize("device", ["cpu", "cuda"], ids=["cpu_state", "gpu_state"])
def test_nested_regions_restore_each_level(device):
    before = _state(device)
    with autocast(device, dtype=torch.float16, cache_enabled=False):
        outer = _state(device)
        assert outer == (True, torch.float16, False)
        with autocast(device, dtype="bf16", enabled=False):
            # cache_enabled=None keeps the enclosing region's setting, as torch.autocast does
            assert _state(device) == (False, torch.bfloat16, False)
        assert _state(device) == outer
    assert _state(device) == before


def test_state_restored_when_body_raises():
    before = _state("cpu")
    with pytest.raises(KeyError):
        with autocast("cpu", dtype=torch.float16):
            with autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
                raise KeyError("boom")
    assert _state("cpu") == before


def test_cpu_matmul_runs_in_the_autocast_dtype_and_decorator_form():
    a, b = torch.randn(4, 5), torch.randn(5, 3)
    with autocast("cpu"):
        assert (a @ b).dtype == torch.bfloat16
    assert (a @ b).dtype == torch.float32

    @autocast("cpu", dtype=torch.bfloat16)
    def mm():
        return a @ b

    assert mm().dtype == torch.bfloat16


def test_same_instance_reentered():
    region = autocast("cpu", dtype=torch.float16)
    before = _state("cpu")
    with region:
        with region:
            assert _state("cpu")[:2] == (True, torch.float16)
        assert _state("cpu")[:2] == (True, torch.float16)
    assert _state("cpu") == before


@pytest.mark.parametrize(
    "kwargs, error, text",
    [
        ({"device_type": "tpu"}, ValueError, "device_type must be one of cuda, cpu, got 'tpu'"),
        (
            {"dtype": torch.int8},
            ValueError,
            "dtype must be None, torch.float32, torch.bfloat16, torch.float16 "
            "or one of fp32, float32, bf16, bfloat16, fp16, float16, got torch.int8",
        ),
        ({"cache_enabled": "yes"}, TypeError, "cache_enabled must be a bool, got 'yes'"),
        ({"enabled": 1}, TypeError, "enabled must be a bool, got 1"),
    ],
)
def test_bad_arguments(kwargs, error, text):
    with pytest.raises(error) as info:
        autocast(**kwargs)
    assert text in str(info.value)


def test_precision_settings():
    assert precision_settings("bf16") == (torch.bfloat16, False)
    assert precision_settings("fp16") == (torch.float16, True)
    assert precision_settings("fp32") == (None, False)
    # Derived from clorch.precision, so torch's dtype names are accepted too.
    assert precision_settings("bfloat16") == (torch.bfloat16, False)
    assert precision_settings("float16") == (torch.float16, True)
    assert precision_settings("float32") == (None, False)
    with pytest.raises(ValueError) as info:
        precision_settings("fp8")
    assert str(info.value) == "precision must be one of fp32, bf16, fp16 (or float32, bfloat16, float16), got 'fp8'"
