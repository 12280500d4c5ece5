"""A model with BatchNorm, dropout, a learnable scalar and a tied weight, trained on 2 CPU ranks
(gloo) with gradient clipping and decay groups: the run ends (digest, export), its reported eval is
the exported model's in one process, each rank draws its own dropout masks from the same initial
weights, the logged lr is the step's own, and a kill + resume ends bit-identical."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import clorch
from clorch.config import compose
from clorch.plan.plan import resolve
from clorch.distributed import all_gather_into
from clorch.engine.api import overrides_for
from clorch.train.components import build_components, training_seed
from clorch.train.evaluate import evaluate
from clorch.train.loop import train_step
from clorch.train.metrics import read_metrics, without_timing
from clorch.strategies import weights_digest
from clorch.optim import build_scheduler
from tests.engine.faulty_worker import FAIL_EXIT_CODE, run_failing
from tests.harness import run_ranks

pytestmark = pytest.mark.timeout(300)

TRUST = {"CLORCH_TRUSTED_MODULES": "tests"}
# 256 samples, 2 ranks x 16: 8 steps an epoch, 16 in all; checkpoints every 3 steps, the kill
# after step 10 resumes from step 9. fp16: clipping comes after the scaler's unscaling.
RUN = {
    "recipe": "cpu_smoke",
    "epochs": 2,
    "sample_count": 256,
    "precision": "fp16",
    "seed": 7,
    "model._target_": "tests.models.state_models.NormDropoutNet",
    "model.dropout": 0.2,
    "optim.grad_clip": 0.5,
    "optim.weight_decay": 0.1,
    "optim.decay": "matrices",
    "schedule": "cosine",
    "schedule.warmup_steps": 3,
    "eval_every": 5,
    "checkpoint": "periodic",
    "checkpoint.every_n_steps": 3,
    "checkpoint.export": "safetensors",
}


def _overrides(values: dict) -> list[str]:
    """Hydra overrides for run_local's arguments, to compose in-process."""
    kwargs = {k: v for k, v in values.items() if k != "recipe"}
    return overrides_for(None, None, values["recipe"], kwargs)


def _metrics(result) -> list[dict]:
    return without_timing(read_metrics(Path(result["run_dir"]) / "metrics.jsonl"))


def _draws_then_eval(rank: int, world_size: int, overrides: list[str]) -> dict:
    """One rank: its initial weights' digest and dropout mask (all-gathered), then a few steps
    and an evaluation: its BatchNorm statistics, its state and the eval metrics."""
    plan = resolve(compose(overrides))
    parts = build_components(plan.config, {"rank": rank, "world_size": world_size}, plan.total_steps)
    digest = weights_digest(parts.raw_model)
    mask = parts.raw_model.train().drop(torch.ones(256))
    masks = torch.empty(world_size, 256)
    all_gather_into(masks, mask.reshape(1, -1))
    indices = parts.sampler.sample_indices()
    for step in range(3):
        train_step(parts, [parts.task.batch(indices[step * 16 : (step + 1) * 16])])
    return {
        "digest": digest,
        "masks": list(masks),
        "eval": evaluate(parts),
        "running_mean": parts.raw_model.norm.running_mean.clone(),
        "state": {k: v.clone() for k, v in parts.raw_model.state_dict().items()},
    }


def test_ranks_start_alike_draw_their_own_dropout_and_evaluate_rank_0s_buffers(monkeypatch):
    """ddp.broadcast_buffers=false: each rank keeps its own BatchNorm statistics while training,
    and eval still runs on rank 0's on every rank (the model a checkpoint and an export hold)."""
    for key, value in TRUST.items():
        monkeypatch.setenv(key, value)
    overrides = _overrides(
        {**{k: v for k, v in RUN.items() if not k.startswith("checkpoint")}, "ddp.broadcast_buffers": False}
    )
    first, second = run_ranks(_draws_then_eval, 2, overrides, timeout=120)
    assert first["digest"] == second["digest"]
    masks = first["masks"]
    assert not torch.equal(masks[0], masks[1])
    for rank, mask in enumerate(masks):  # from the seed, by rank
        torch.manual_seed(training_seed(RUN["seed"], rank))
        assert torch.equal(mask, torch.nn.functional.dropout(torch.ones(256), 0.2))
    assert not torch.equal(first["running_mean"], second["running_mean"])
    assert first["eval"] == second["eval"]
    plan = resolve(compose(overrides))
    alone = build_components(plan.config, {"rank": 0, "world_size": 1}, plan.total_steps)
    alone.raw_model.load_state_dict(first["state"])
    assert evaluate(alone)["loss"] == pytest.approx(first["eval"]["loss"], rel=1e-6)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("model_runs")
    with pytest.MonkeyPatch.context() as patch:
        for key, value in TRUST.items():
            patch.setenv(key, value)
        result = clorch.run_local(run_dir=tmp / "a", **{**RUN, "checkpoint.dir": str(tmp / "ckpt_a")})
    assert result["status"]["state"] == "succeeded", result["logs"]
    return tmp, result


def test_the_reported_eval_is_the_exported_models(uninterrupted, monkeypatch):
    """Each rank's BatchNorm statistics differ; eval, checkpoint and export use rank 0's."""
    _, result = uninterrupted
    summary = result["summary"]
    exported = summary["exported"]
    assert exported and Path(exported).is_file() and summary["weights_sha256"]
    for key, value in TRUST.items():
        monkeypatch.setenv(key, value)
    plan = resolve(
        compose(
            _overrides(
                {**{k: v for k, v in RUN.items() if not k.startswith("checkpoint")}, "model.init_from": exported}
            )
        )
    )
    alone = build_components(plan.config, {"rank": 0, "world_size": 1}, plan.total_steps)
    assert weights_digest(alone.raw_model) == summary["weights_sha256"]
    assert evaluate(alone)["loss"] == pytest.approx(summary["final"]["eval_loss"], rel=1e-6)


def test_the_logged_lr_is_the_steps_own_and_the_gradient_norm_is_logged(uninterrupted):
    _, result = uninterrupted
    records = [r for r in _metrics(result) if r["kind"] == "train"]
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=3e-3)  # the config's lr
    schedule = build_scheduler(optimizer, "cosine", warmup_steps=3, total_steps=16, min_lr_ratio=0.1)
    lrs = []
    for _ in range(16):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert [r["lr"] for r in records] == [lrs[r["step"] - 1] for r in records]
    assert records[0]["lr"] == lrs[1] != lrs[2]
    assert all(r["grad_norm"] > 0 for r in records)


def test_killed_then_resumed_is_bit_identical(uninterrupted, monkeypatch):
    tmp, first = uninterrupted
    for key, value in TRUST.items():
        monkeypatch.setenv(key, value)
    killed = run_failing(tmp / "killed", 10, monkeypatch, **{**RUN, "checkpoint.dir": str(tmp / "ckpt_k")})
    assert killed["status"]["exit_codes"][1] == FAIL_EXIT_CODE
    resumed = clorch.run_local(
        run_dir=tmp / "resumed", **{**RUN, "checkpoint.dir": str(tmp / "ckpt_k"), "checkpoint.resume": "latest"}
    )
    assert resumed["status"]["state"] == "succeeded", resumed["logs"]
    assert resumed["summary"]["resumed_from"].endswith("step_00000009.ckpt")
    assert _metrics(resumed) == _metrics(first)
    assert resumed["summary"]["weights_sha256"] == first["summary"]["weights_sha256"]
