"""Precision names shared by the config, DDP's reduce_dtype and autocast (torch-free).

Composing and checking a config must not import torch, so the names map to the
*attribute names* of torch dtypes; `torch_dtype()` turns one into the dtype.
"""

from __future__ import annotations

DTYPE_NAMES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16",
               "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16"}
"""Every dtype name clorch accepts (config values, `reduce_dtype=`, autocast `dtype=`)."""


def torch_dtype(name: str):
    """The torch dtype for a name of `DTYPE_NAMES` (imports torch)."""
    import torch

    return getattr(torch, DTYPE_NAMES[name])
