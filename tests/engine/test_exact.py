"""`exact=true` end to end on gloo ranks: one global batch, one weights digest, on any world size.

A tiny GPT with dropout and gradient clipping, fp32, 6 optimizer steps of 16 samples
(micro-batches of 4): 1 rank with accumulation 4, 2 ranks with 2, 4 ranks with 1.
Then the 2-rank run resumed on 1 rank from its step-4 checkpoint, and the 1-rank
run resumed on 2 ranks: each ends on the same bits, and logs the same losses.
parallel=fsdp on 2 ranks and on 1, and its 2-rank run resumed on 1 rank, end on
parallel=ddp's bits too.
Without exact=true the same runs differ (another order of the gradient's sum,
other dropout masks): tests/engine/test_reshard_resume.py holds what they keep then.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from clorch.train.metrics import read_metrics
from tests.clirunner import run_clorch_train, run_clorch_train_batch

pytestmark = pytest.mark.timeout(420)

JOB = [
    "backend=gloo",
    "precision=fp32",
    "model=gpt",
    "data=arithmetic",
    "model.n_layer=1",
    "model.d_model=32",
    "model.n_head=2",
    "model.dropout=0.1",
    "optim.grad_clip=0.5",
    "data.sample_count=256",
    "batch_size=4",
    "max_steps=6",
    "log_every=1",
    "eval_every=0",
    "logger.progress=off",
    "checkpoint=periodic",
    "checkpoint.every_n_steps=2",
    "checkpoint.keep_last=4",
    "exact=true",
]


def _args(run: Path, ranks: int, accumulation: int, *more: str) -> list[str]:
    return [*JOB, f"launcher.nproc_per_node={ranks}", f"accumulation={accumulation}", *more, f"hydra.run.dir={run}"]


def _digest(run: Path) -> str:
    return json.loads((run / "summary.json").read_text())["weights_sha256"]


def _losses(run: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(run / "metrics.jsonl") if r.get("kind") == "train"]


def test_one_digest_on_1_2_and_4_ranks_ddp_or_fsdp_and_after_resuming_on_another_world_size(tmp_path):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    names = ("w1", "w2", "w4", "w2_to_1", "w1_to_2", "fsdp_w2", "fsdp_w1", "fsdp_w2_to_1")
    runs = {name: tmp_path / name for name in names}
    first = run_clorch_train_batch(
        [
            (_args(runs["w1"], 1, 4), tmp_path),
            (_args(runs["w2"], 2, 2), tmp_path),
            (_args(runs["w4"], 4, 1), tmp_path),
            (_args(runs["fsdp_w2"], 2, 2, "parallel=fsdp"), tmp_path),
            (_args(runs["fsdp_w1"], 1, 4, "parallel=fsdp"), tmp_path),
        ],
        env=env,
        timeout=300,
    )
    for done in first:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    step4 = "checkpoints/step_00000004.ckpt"
    fsdp_step4 = runs["fsdp_w2"] / "checkpoints/step_00000004.dcp"
    second = run_clorch_train_batch(
        [
            (_args(runs["w2_to_1"], 1, 4, f"checkpoint.resume={runs['w2'] / step4}"), tmp_path),
            (_args(runs["w1_to_2"], 2, 2, f"checkpoint.resume={runs['w1'] / step4}"), tmp_path),
            (_args(runs["fsdp_w2_to_1"], 1, 4, "parallel=fsdp", f"checkpoint.resume={fsdp_step4}"), tmp_path),
        ],
        env=env,
        timeout=200,
    )
    for done in second:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    digests = {name: _digest(run) for name, run in runs.items()}
    assert len(set(digests.values())) == 1, digests
    assert _losses(runs["w1"]) == _losses(runs["w2"]) == _losses(runs["w4"]) == _losses(runs["fsdp_w2"])
    assert _losses(runs["fsdp_w1"]) == _losses(runs["w1"])
    assert len(_losses(runs["w1"])) == 6


def test_what_exact_cannot_hold_is_refused_by_name(tmp_path):
    sharded = run_clorch_train(
        _args(tmp_path / "fsdp", 1, 1, "parallel=fsdp", "precision=bf16", "parallel.cpu_offload=true"),
        tmp_path,
        timeout=120,
    )
    assert sharded.returncode == 2, sharded.stdout + sharded.stderr
    said = sharded.stdout + sharded.stderr
    assert "precision=bf16 needs parallel.param_dtype=fp32, got parallel.param_dtype=auto" in said
    assert "cannot keep parallel.cpu_offload=true" in said
    stepping = run_clorch_train(
        _args(tmp_path / "sib", 1, 1, "ddp.step_in_backward=true", "optim.grad_clip=null"), tmp_path, timeout=120
    )
    assert stepping.returncode == 2, stepping.stdout + stepping.stderr
    assert "drop ddp.step_in_backward=true" in stepping.stdout + stepping.stderr
    buckets = run_clorch_train(_args(tmp_path / "buckets", 1, 1, "ddp.bucket_cap_mb=5"), tmp_path, timeout=120)
    assert buckets.returncode == 2, buckets.stdout + buckets.stderr
    assert "ddp.bucket_cap_mb=5 does nothing with exact=true" in buckets.stdout + buckets.stderr


def test_a_batch_norm_model_is_refused_under_exact():
    import torch

    from clorch.strategies.exact import refuse_inexact_modules

    with pytest.raises(ValueError, match=r"exact=true cannot make BatchNorm1d 1 exact.*track_running_stats=False"):
        refuse_inexact_modules(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)))
    refuse_inexact_modules(
        torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4, track_running_stats=False))
    )
