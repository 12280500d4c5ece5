"""A torch DDP script runs on clorch by changing its imports, with the same numbers (gloo, 2 ranks)."""

from __future__ import annotations

import pytest
import torch

from tests.harness import run_ranks
from tests.port.port import CLORCH_IMPORTS, TORCH_IMPORTS, run_both, source

pytestmark = pytest.mark.timeout(300)


def _compare(per_rank, **tol):
    for rank, result in enumerate(per_rank):
        ours, theirs = result["clorch"], result["torch"]
        for key in ("losses", "norms"):
            torch.testing.assert_close(
                torch.tensor(ours[key]), torch.tensor(theirs[key]), equal_nan=True, msg=f"rank {rank} {key}", **tol
            )
        for name, value in theirs["weights"].items():
            torch.testing.assert_close(ours["weights"][name], value, msg=f"rank {rank} {name}", **tol)
        assert ours["scale"] == theirs["scale"]
    # DDP keeps every rank's replica identical.
    for name, value in per_rank[0]["clorch"]["weights"].items():
        torch.testing.assert_close(per_rank[1]["clorch"]["weights"][name], value, rtol=0, atol=0)


def test_only_the_imports_differ():
    torch_text, clorch_text = source("torch"), source("clorch")
    assert torch_text.replace(TORCH_IMPORTS, CLORCH_IMPORTS) == clorch_text != torch_text


def test_fp32_with_scaler_is_bit_identical_to_torch():
    # A poisoned step: the loss on rank 0 is inf, both scalers skip it and back off.
    per_rank = run_ranks(
        run_both, 2, "gloo", {"steps": 20, "precision": "fp32", "poison_step": 7}, init_group=False, timeout=240
    )
    _compare(per_rank, rtol=0, atol=0)
    assert per_rank[0]["clorch"]["scale"] == 2.0**11


def test_bf16_autocast_matches_torch():
    # Both runs execute the same bf16 kernels on the same inputs; only the gradient reduction
    # differs in code path (clorch's buckets vs torch's), and at 2 ranks (a + b) / 2 is exact,
    # so agreement is expected to the last bit; the tolerance only covers bf16 rounding (2^-8).
    per_rank = run_ranks(run_both, 2, "gloo", {"steps": 12, "precision": "bf16"}, init_group=False, timeout=240)
    _compare(per_rank, rtol=4e-3, atol=1e-5)
