"""`clorch-train parallel=fsdp` against the same job under `parallel=ddp`, on 2 CPU ranks over gloo.

One small GPT (2 blocks: two fully_shard units plus the root, tied embedding and
output), fp32, accumulation 2 and gradient clipping that acts, 6 steps. Three
launches in all: ddp (with activation checkpointing), fsdp with periodic
checkpoints, and fsdp resumed from the step 4 checkpoint (resume=latest) to the
end; fsdp with activation checkpointing is tested in tests/nn/test_fsdp.py. 257 eval
samples over 2 ranks in batches of 8: rank 0 has 17 batches, rank 1 16, so the sharded
evaluation must run one more (collective) forward on rank 1.

Tolerance: 1e-5 relative on each step's loss and 1e-6 absolute on each final
weight. The two runs start from the same weights and see the same batches; they
differ only in how the gradients are summed (DDP's all-reduce of whole buckets,
FSDP's reduce-scatter of shards) and in the clipped norm's partial sums, which
may round differently in fp32 (about 1e-7 relative a step, over 6 steps).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from clorch.train.metrics import read_metrics
from tests.pins import check_pinned
from tests.clirunner import run_clorch_train

pytestmark = pytest.mark.timeout(300)

JOB = [
    "backend=gloo",
    "precision=fp32",
    "model=gpt",
    "data=arithmetic",
    "model.n_layer=2",
    "model.d_model=32",
    "model.n_head=2",
    "data.sample_count=257",
    "batch_size=8",
    "accumulation=2",
    "max_steps=6",
    "log_every=1",
    "optim.grad_clip=0.5",
    "launcher.nproc_per_node=2",
    "logger.progress=off",
    "checkpoint.export=safetensors",
]
LOSS_RTOL, WEIGHT_ATOL = 1e-5, 1e-6
# summary.json's weights_sha256 of the `runs` fixture's two jobs, as clorch trained them at commit
# a880d15, before the parallel modes became strategy classes (clorch.strategies): obtained by
# running these two jobs there, per kind of CPU (tests/pins.py). Moving the mode's code must not
# change a bit of what it trains. The first pin's machine (2026-12-06) recorded no CPU; the
# second was taken at 74d5c33 (the same bits as a880d15 on that machine's kind: code after a880d15
# changed nothing) with torch 2.11 and 2.14 alike.
PINNED_SHA256 = {
    "2026-12-06 machine": {
        "ddp": "00040d9fe6594002849ab1e95068b1ce441f0da85865d4b1181d352dc3737b9b",
        "fsdp": "944f2c0804bb7df6dc416b2b9aa998d745e5682ce8ade8df804475c369e1bfc1",
    },
    "AVX512 Intel(R) Xeon(R) Processor": {
        "ddp": "fd01917633ca3a6f4c9276694c3c57a4d726df2cd32d2d92e41242fc78f39ba1",
        "fsdp": "caa679b6751826dd4e6bc06be350961d18cc9aea69d2f268f9d98d2961cd9903",
    },
}


def _train(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, Path | None]:
    cwd.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = run_clorch_train([*args, f"hydra.run.dir={cwd / 'run'}"], cwd, env=env, timeout=240)
    return proc, cwd / "run"


def _losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"}


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp")
    # Activation checkpointing under ddp: recomputing the blocks' forwards changes no number.
    ddp, ddp_dir = _train([*JOB, "model.activation_checkpointing=true"], tmp / "ddp")
    assert ddp.returncode == 0, ddp.stderr
    fsdp, fsdp_dir = _train(
        [
            *JOB,
            "parallel=fsdp",
            "checkpoint=periodic",
            "checkpoint.every_n_steps=2",
            "checkpoint.keep_last=2",
            f"checkpoint.dir={tmp / 'ckpt'}",
        ],
        tmp / "fsdp",
    )
    assert fsdp.returncode == 0, fsdp.stderr
    return tmp, ddp_dir, fsdp_dir


def test_fsdp_trains_as_ddp_does(runs):
    _, ddp_dir, fsdp_dir = runs
    ddp_losses, fsdp_losses = _losses(ddp_dir), _losses(fsdp_dir)
    assert sorted(fsdp_losses) == [1, 2, 3, 4, 5, 6] and sorted(ddp_losses) == sorted(fsdp_losses)
    for step, loss in ddp_losses.items():
        assert fsdp_losses[step] == pytest.approx(loss, rel=LOSS_RTOL), step
    assert fsdp_losses[6] < fsdp_losses[1]  # it learns, not just runs
    ddp_summary, fsdp_summary = _summary(ddp_dir), _summary(fsdp_dir)
    assert fsdp_summary["final"]["grad_norm"] == pytest.approx(ddp_summary["final"]["grad_norm"], rel=LOSS_RTOL)
    assert fsdp_summary["final"]["eval_loss"] == pytest.approx(ddp_summary["final"]["eval_loss"], rel=LOSS_RTOL)
    # The exported weights: gathered whole to rank 0, every name of the model's state dict.
    ddp_weights, fsdp_weights = load_file(ddp_dir / "model.safetensors"), load_file(fsdp_dir / "model.safetensors")
    assert sorted(ddp_weights) == sorted(fsdp_weights)
    for name, value in ddp_weights.items():
        assert fsdp_weights[name].shape == value.shape, name
        torch.testing.assert_close(fsdp_weights[name], value, rtol=0, atol=WEIGHT_ATOL, msg=name)


def test_both_modes_train_the_weights_they_trained_before(runs):
    _, ddp_dir, fsdp_dir = runs
    got = {"ddp": _summary(ddp_dir)["weights_sha256"], "fsdp": _summary(fsdp_dir)["weights_sha256"]}
    check_pinned(got, PINNED_SHA256, "74d5c33")


def test_fsdp_checkpoints_are_sharded_and_pruned(runs):
    tmp, _, _ = runs
    ckpt = tmp / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir() if not p.name.startswith(".")) == [
        "final.dcp",
        "step_00000004.dcp",
        "step_00000006.dcp",
    ]  # keep_last=2 removed step 2
    for rank in (0, 1):  # each rank wrote its own shards
        assert (ckpt / "step_00000004.dcp" / f"__{rank}_0.distcp").is_file()


def test_fsdp_resumes_latest_and_ends_where_the_uninterrupted_run_did(runs):
    tmp, _, fsdp_dir = runs
    resumed_ckpt = tmp / "resumed_ckpt"
    resumed_ckpt.mkdir()
    shutil.copytree(tmp / "ckpt" / "step_00000004.dcp", resumed_ckpt / "step_00000004.dcp")
    proc, run_dir = _train(
        [
            *JOB,
            "parallel=fsdp",
            "checkpoint=periodic",
            "checkpoint.every_n_steps=2",
            f"checkpoint.dir={resumed_ckpt}",
            "checkpoint.resume=latest",
        ],
        tmp / "resumed",
    )
    assert proc.returncode == 0, proc.stderr
    summary = _summary(run_dir)
    assert summary["resumed_from"] == str(resumed_ckpt / "step_00000004.dcp")
    assert summary["steps"] == 6
    # Same world size: sampler, RNG, optimizer and schedule continue exactly.
    assert summary["weights_sha256"] == _summary(fsdp_dir)["weights_sha256"]
    resumed_losses, full = _losses(run_dir), _losses(fsdp_dir)
    assert {s: resumed_losses[s] for s in (5, 6)} == {s: full[s] for s in (5, 6)}


def test_a_fsdp_key_under_ddp_is_a_config_error(tmp_path):
    proc, _ = _train([*JOB, "parallel.reshard_after_forward=false"], tmp_path)
    assert proc.returncode == 2
    assert "parallel.reshard_after_forward is not a key of parallel=ddp" in proc.stderr
    assert "parallel=fsdp" in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_fsdp_with_fp32_gathers_trains_as_ddp_does_in_bf16(tmp_path):
    """parallel.param_dtype=fp32: fp32 parameters gathered, bf16 compute by autocast, as under
    ddp: the same losses (1e-3 relative: bf16 products round alike, only the gradients' sums
    are ordered differently, and a last-bit difference in fp32 may tip a later bf16 rounding)."""
    bf16 = [a for a in JOB if not a.startswith(("precision=", "checkpoint.export"))] + ["precision=bf16"]
    ddp, ddp_dir = _train(bf16, tmp_path / "ddp")
    fsdp, fsdp_dir = _train([*bf16, "parallel=fsdp", "parallel.param_dtype=fp32"], tmp_path / "fsdp")
    assert ddp.returncode == 0 and fsdp.returncode == 0, ddp.stderr + fsdp.stderr
    ddp_losses, fsdp_losses = _losses(ddp_dir), _losses(fsdp_dir)
    assert sorted(fsdp_losses) == sorted(ddp_losses) == [1, 2, 3, 4, 5, 6]
    for step, loss in ddp_losses.items():
        assert fsdp_losses[step] == pytest.approx(loss, rel=1e-3), step


def test_fsdp_fp16_resumes_with_its_loss_scale(tmp_path):
    """fp16 under fsdp: the first steps overflow at an initial scale of 2**32 and back it off;
    a resume from the step 4 checkpoint goes on with the scale the checkpoint holds, so its
    losses and scales are the uninterrupted run's."""
    fp16 = [a for a in JOB if not a.startswith(("precision=", "checkpoint.export"))]
    fp16 += ["precision=fp16", "precision.scaler.initial_scale=4294967296", "parallel=fsdp", "checkpoint=periodic"]
    fp16 += ["checkpoint.every_n_steps=2", "checkpoint.keep_last=3", f"checkpoint.dir={tmp_path / 'ckpt'}"]
    full, full_dir = _train(fp16, tmp_path / "full")
    assert full.returncode == 0, full.stderr
    resumed_ckpt = tmp_path / "resumed_ckpt"
    resumed_ckpt.mkdir()
    shutil.copytree(tmp_path / "ckpt" / "step_00000004.dcp", resumed_ckpt / "step_00000004.dcp")
    resumed_args = [a for a in fp16 if not a.startswith("checkpoint.dir")]
    resumed_args += [f"checkpoint.dir={resumed_ckpt}", "checkpoint.resume=latest"]
    resumed, resumed_dir = _train(resumed_args, tmp_path / "resumed")
    assert resumed.returncode == 0, resumed.stderr

    def scales(run_dir):
        records = read_metrics(run_dir / "metrics.jsonl")
        return {r["step"]: r["loss_scale"] for r in records if r["kind"] == "train"}

    full_scales = scales(full_dir)
    assert full_scales[1] < 4294967296  # it backed off: the scale the checkpoint must carry
    assert {s: scales(resumed_dir)[s] for s in (5, 6)} == {s: full_scales[s] for s in (5, 6)}
    assert {s: _losses(resumed_dir)[s] for s in (5, 6)} == {s: _losses(full_dir)[s] for s in (5, 6)}
