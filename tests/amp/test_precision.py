"""clorch.precision: one table of precision modes, its names, errors, and no torch on import."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch

from clorch.precision import DTYPE_NAMES, PRECISIONS, Precision, get_precision, torch_dtype

pytestmark = pytest.mark.timeout(60)


def test_modes_and_their_settings():
    assert list(PRECISIONS) == ["fp32", "bf16", "fp16"]
    settings = {name: (p.dtype_name, p.aliases, p.autocast, p.uses_scaler) for name, p in PRECISIONS.items()}
    assert settings == {
        "fp32": ("float32", ("float32",), False, False),
        "bf16": ("bfloat16", ("bfloat16",), True, False),
        "fp16": ("float16", ("float16",), True, True),
    }
    assert [p.torch_dtype() for p in PRECISIONS.values()] == [torch.float32, torch.bfloat16, torch.float16]
    assert [p.autocast_dtype() for p in PRECISIONS.values()] == [None, torch.bfloat16, torch.float16]
    with pytest.raises(dataclasses.FrozenInstanceError):
        PRECISIONS["bf16"].uses_scaler = True


@pytest.mark.parametrize(
    "name, canonical",
    [
        ("fp32", "fp32"),
        ("float32", "fp32"),
        ("bf16", "bf16"),
        ("bfloat16", "bf16"),
        ("fp16", "fp16"),
        ("float16", "fp16"),
    ],
)
def test_every_name_and_alias_finds_its_mode(name, canonical):
    assert get_precision(name) is PRECISIONS[canonical]
    assert torch_dtype(name) == PRECISIONS[canonical].torch_dtype()


def test_dtype_names_are_derived_from_the_modes():
    assert DTYPE_NAMES == {
        "fp32": "float32",
        "float32": "float32",
        "bf16": "bfloat16",
        "bfloat16": "bfloat16",
        "fp16": "float16",
        "float16": "float16",
    }
    assert list(DTYPE_NAMES) == [name for p in PRECISIONS.values() for name in p.names]


@pytest.mark.parametrize(
    "device_type, texts",
    [
        ("cuda", ["fp32", "bf16 autocast", "fp16 autocast with loss scaling"]),
        ("cpu", ["fp32", "bf16 CPU autocast", "fp16 CPU autocast with loss scaling"]),
    ],
)
def test_describe(device_type, texts):
    assert [p.describe(device_type) for p in PRECISIONS.values()] == texts


@pytest.mark.parametrize(
    "call, error, text",
    [
        (
            lambda: get_precision("fp8"),
            ValueError,
            "precision must be one of fp32, bf16, fp16 (or float32, bfloat16, float16), got 'fp8'",
        ),
        (lambda: get_precision("BF16"), ValueError, "got 'BF16'"),
        (
            lambda: get_precision(torch.bfloat16),
            TypeError,
            "precision must be a str, one of fp32, bf16, fp16 (or float32, bfloat16, float16), "
            "got torch.bfloat16 (dtype)",
        ),
        (lambda: get_precision(None), TypeError, "got None (NoneType)"),
        (lambda: torch_dtype("int8"), ValueError, "got 'int8'"),
        (lambda: PRECISIONS["bf16"].describe("tpu"), ValueError, "device_type must be one of cuda, cpu, got 'tpu'"),
    ],
)
def test_errors_name_the_value_and_what_is_allowed(call, error, text):
    with pytest.raises(error) as info:
        call()
    assert text in str(info.value)


def test_import_needs_no_torch():
    code = (
        "import sys, clorch.precision as p; p.get_precision('bf16'); p.PRECISIONS['fp16'].describe('cpu'); "
        "sys.exit('torch' in sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)


def test_a_mode_is_a_plain_value():
    mode = Precision("bf16", "bfloat16", ("bfloat16",), autocast=True, uses_scaler=False)
    assert mode == PRECISIONS["bf16"] and hash(mode) == hash(PRECISIONS["bf16"])
