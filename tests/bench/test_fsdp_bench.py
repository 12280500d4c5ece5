"""`clorch-bench fsdp`: argument errors in-process, both candidates on 2 gloo ranks (the cuda run is manual)."""

from __future__ import annotations

import math

import pytest

from clorch.bench import fsdp
from tests.harness import run_ranks

QUICK = {
    "model": "gpt-tiny",
    "device": "cpu",
    "precision": "fp32",
    "batch": 2,
    "rounds": 1,
    "steps": 1,
    "warmup": 0,
    "compile": False,
}


def test_every_bad_argument_is_reported_at_once(capsys):
    with pytest.raises(SystemExit) as exc:
        fsdp.main(["--batch", "0", "--rounds", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--batch must be >= 1, got 0" in err and "--rounds must be >= 1, got 0" in err


def _worker(rank: int, world_size: int) -> dict:
    return fsdp.worker({"args": QUICK})


@pytest.mark.timeout(180)
def test_both_candidates_on_two_gloo_ranks():
    results = run_ranks(_worker, 2, timeout=160)
    for result in results:
        assert set(result["medians_s"]) == {fsdp.CLORCH, fsdp.TORCH}
        assert all(value > 0 for value in result["medians_s"].values())
        assert result["ratio_clorch_torch"] > 0 and not math.isnan(result["ratio_clorch_torch"])
    assert "| clorch fsdp |" in results[0]["table"].replace("  ", "")
