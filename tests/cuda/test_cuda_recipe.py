"""GPU tier: a recipe end to end through clorch.run_local on one GPU over nccl."""

from __future__ import annotations

import json

import pytest

import clorch

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(600)]


def test_gpt_bf16_recipe_runs_on_gpu_zero(tmp_path):
    result = clorch.run_local(devices=[0], recipe="gpt_bf16", run_dir=str(tmp_path / "run"),
                              max_steps=30, eval_every=15, **{"schedule.warmup_steps": 5})
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
