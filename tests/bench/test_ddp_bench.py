"""`clorch-bench ddp`: argument errors in-process, both workloads on 2 gloo ranks, and on GPUs (cuda tier)."""

from __future__ import annotations

import pytest
import torch

from clorch.bench import ddp
from tests.harness import run_ranks

CANDIDATES = [
    "clorch DDP",
    "clorch DDP bf16",
    "clorch DDP grad views",
    "clorch DDP step_in_backward",
    "torch DDP",
    "torch DDP best",
    ddp.TORCH_BF16,
    "one process",
]
QUICK = {"rounds": 1, "warmup": 1, "steps": 1, "batch": 2}


def test_every_bad_argument_is_reported_at_once(capsys):
    with pytest.raises(SystemExit) as exc:
        ddp.main(["--batch", "0", "--rounds", "0", "--bucket-cap-mb", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--batch must be >= 1, got 0" in err and "--rounds must be >= 1, got 0" in err
    assert "--bucket-cap-mb must be > 0 (MiB), got 0.0" in err


def test_batch_defaults_per_model():
    assert ddp._argv_args(ddp.parser().parse_args([]))["batch"] == 64
    assert ddp._argv_args(ddp.parser().parse_args(["--model", "gpt2-small"]))["batch"] == 8


def _both_workloads(rank: int, world_size: int, device: str) -> dict:
    import clorch.distributed as cd

    ctx = {"rank": rank, "world_size": world_size, "backend": cd.backend()}
    mlp = ddp.worker({**ctx, "args": {**QUICK, "model": "mlp", "width": 64, "features": 16}})
    gpt = ddp.worker({**ctx, "args": {**QUICK, "model": "gpt-tiny", "device": device}})
    return {"mlp": mlp, "gpt": gpt}


@pytest.mark.timeout(120)
def test_mlp_and_gpt_tiny_on_two_gloo_ranks():
    result = run_ranks(_both_workloads, 2, "cpu", timeout=100)[0]
    for name in ("mlp", "gpt"):
        assert list(result[name]["medians_s"]) == CANDIDATES
        assert all(t > 0 for t in result[name]["medians_s"].values())
    assert "clorch DDP / torch DDP" not in result["mlp"]["table"]  # the MLP's table is unchanged
    gpt = result["gpt"]["table"]
    assert "gpt-tiny" in gpt and "batch 2x64 tokens/rank" in gpt and "2 ranks, gloo" in gpt
    assert "clorch DDP / torch DDP step time:" in gpt and "scaling efficiency" in gpt
    assert f"clorch DDP bf16 / {ddp.TORCH_BF16} step time:" in gpt
    assert result["gpt"]["scaling_efficiency"]["one process"] == 1.0


@pytest.mark.timeout(120)
def test_gpt_tiny_on_one_gloo_rank_runs_the_bucket_path_candidates():
    result = run_ranks(_both_workloads, 1, "cpu", timeout=100)[0]
    names = list(result["gpt"]["medians_s"])
    assert names == [
        *CANDIDATES[:1],
        "clorch DDP bucket path",
        "clorch DDP bucket path grad views",
        *CANDIDATES[1:],
        ddp.EMPTY_HOOKS,
    ]
    assert ddp.EMPTY_HOOKS not in result["gpt"]["scaling_efficiency"]
    summary = result["gpt"]["table"].split("scaling efficiency", 1)[1]
    assert "clorch DDP bucket path grad views" in summary and "empty Python hooks" not in summary


def _on_a_cpu_build(rank: int, world_size: int) -> dict:
    import clorch.distributed as cd

    torch.version.cuda = None  # as torch's CPU-only build reports itself (this rank's process only)
    ctx = {"rank": rank, "world_size": world_size, "backend": cd.backend()}
    return ddp.worker({**ctx, "args": {**QUICK, "model": "mlp", "width": 32, "features": 8}})


@pytest.mark.timeout(120)
def test_torch_bf16_hook_candidate_runs_with_a_cpu_build_of_torch():
    # torch refuses bf16_compress_hook by its name without CUDA and NCCL, though gloo reduces bf16
    result = run_ranks(_on_a_cpu_build, 2, timeout=100)[0]
    assert list(result["medians_s"]) == CANDIDATES and result["medians_s"][ddp.TORCH_BF16] > 0


@pytest.mark.cuda
@pytest.mark.timeout(300)
@pytest.mark.parametrize("world_size", list(range(1, torch.cuda.device_count() + 1)) or [1])
def test_gpt_tiny_on_cuda_ranks(world_size):
    result = run_ranks(_both_workloads, world_size, "cuda", backend="nccl", timeout=240)[0]
    gpt = result["gpt"]["table"]
    assert f"{world_size} ranks, nccl" in gpt and "fused AdamW" in gpt
    assert all(t > 0 for t in result["gpt"]["medians_s"].values())
