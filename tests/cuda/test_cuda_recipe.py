"""GPU tier: a recipe end to end through clorch.run_local on one GPU over nccl."""

from __future__ import annotations

import json

import pytest

import clorch

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(600)]


def test_gpt_bf16_recipe_runs_on_gpu_zero(tmp_path):
    result = clorch.run_local(
        devices=[0],
        recipe="gpt_bf16",
        run_dir=str(tmp_path / "run"),
        max_steps=30,
        eval_every=15,
        **{"schedule.warmup_steps": 5},
    )
    assert result["status"]["state"] == "succeeded", result["logs"][0]["stderr"][-3000:]
    summary = result["summary"]
    assert summary["status"] == "succeeded" and summary["steps"] == 30
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert env["plan"]["backend"] == "nccl" and env["gpus"] and env["nccl"]
    assert summary["final"]["eval_loss"] < 5.0  # far below log(256) = 5.55 after 30 steps


def test_gpt_bf16_recipe_learns_the_sums_on_one_gpu(tmp_path):
    """The whole flagship recipe, as `clorch-train +recipe=gpt_bf16` runs it on one GPU."""
    result = clorch.run_local(devices=[0], recipe="gpt_bf16", run_dir=str(tmp_path / "run"), progress="off")
    assert result["status"]["state"] == "succeeded", result["logs"][0]["stderr"][-3000:]
    assert result["summary"]["final"]["eval_exact"] > 0.5, result["summary"]["final"]


def _losses(run_dir, result) -> list[float]:
    assert result["status"]["state"] == "succeeded", result["logs"][0]["stderr"][-3000:]
    records = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    return [r["loss"] for r in records if r["kind"] == "train"]


@pytest.mark.parametrize("mode", ["reduce-overhead"])
def test_compile_with_cuda_graphs_trains_like_default_compile(mode, tmp_path):
    """compile_mode with CUDA graphs (the step replays recorded graphs) gives default compile's losses."""
    tiny = {
        "max_steps": 12,
        "log_every": 2,
        "eval_every": 6,
        "precision": "fp32",
        "compile": True,
        "schedule.warmup_steps": 2,
        "model.n_layer": 2,
    }
    runs = {
        name: clorch.run_local(
            devices=[0], recipe="gpt_bf16", run_dir=str(tmp_path / name), progress="off", compile_mode=name, **tiny
        )
        for name in ("default", mode)
    }
    losses = {name: _losses(tmp_path / name, result) for name, result in runs.items()}
    assert len(losses["default"]) == len(losses[mode]) == 6
    for want, got in zip(losses["default"], losses[mode]):
        assert abs(got - want) <= 1e-3 * abs(want) + 1e-4, losses
    finals = [runs[name]["summary"]["final"]["eval_loss"] for name in ("default", mode)]
    assert abs(finals[0] - finals[1]) <= 1e-3 * abs(finals[0]), finals


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_recipe_trains_sharded_on_one_gpu(precision, tmp_path):
    """parallel=fsdp on the GPU: built on the meta device, sharded, filled shard by shard; fp16
    with the loss scaler on sharded gradients."""
    result = clorch.run_local(
        devices=[0],
        recipe="gpt_bf16",
        run_dir=str(tmp_path / "run"),
        max_steps=30,
        eval_every=15,
        progress="off",
        parallel="fsdp",
        precision=precision,
        **{"schedule.warmup_steps": 5},
    )
    assert result["status"]["state"] == "succeeded", result["logs"][0]["stderr"][-3000:]
    final = result["summary"]["final"]
    assert final["eval_loss"] < 5.0, final  # far below log(256) = 5.55 after 30 steps
    assert (final["loss_scale"] is not None) == (precision == "fp16"), final
