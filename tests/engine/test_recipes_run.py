"""Each shipped recipe runs end to end on CPU (2 gloo ranks) at a tiny size."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import clorch
from clorch.train.metrics import read_metrics

pytestmark = pytest.mark.timeout(120)

TINY = {
    "cpu_smoke": {},
    "ddp_fp32": dict(epochs=1, sample_count=128, batch_size=16),
    "ddp_fp16": dict(epochs=1, sample_count=128, batch_size=16, accumulation=2),
    "gpt_bf16": {
        "sample_count": 256,
        "batch_size": 16,
        "model.n_layer": 1,
        "model.d_model": 32,
        "data.digits": 2,
        "schedule.warmup_steps": 2,
    },
}


def _check_outputs(result) -> list[dict]:
    run_dir = Path(result["run_dir"])
    assert result["status"]["state"] == "succeeded", result["logs"]
    for name in ("config.yaml", "env.json", "metrics.jsonl", "summary.json"):
        assert (run_dir / name).is_file(), name
    for rank in (0, 1):
        assert (run_dir / "logs" / f"rank_{rank}.stdout").is_file()
    env = json.loads((run_dir / "env.json").read_text())
    assert env["torch"] and env["python"] and env["host"] and env["plan"]["backend"] == "gloo"
    summary = result["summary"]
    assert summary["status"] == "succeeded" and summary["steps"] == summary["planned_steps"]
    assert summary["samples_per_s"] > 0 and summary["wall_time_s"] > 0
    records = read_metrics(run_dir / "metrics.jsonl")
    assert all(math.isfinite(r["loss"]) for r in records if r["kind"] == "train")
    return records


@pytest.mark.parametrize("recipe", sorted(TINY))
def test_recipe_runs_end_to_end(recipe, tmp_path):
    result = clorch.run_local(recipe=recipe, run_dir=tmp_path / "run", **TINY[recipe])
    records = _check_outputs(result)
    final = result["summary"]["final"]
    assert "eval_loss" in final
    if recipe == "gpt_bf16":
        assert 0.0 <= final["eval_exact"] <= 1.0
        assert result["summary"]["tokens_per_s"] > 0
        assert any("tokens_per_s" in r for r in records)
    if recipe == "ddp_fp16":
        assert all(r["loss_scale"] > 0 for r in records if r["kind"] == "train")


def test_ddp_bf16_loss_really_falls_with_the_seed_arguments(tmp_path):
    """run_local with the arguments docs/training.md shows, at CPU size; the checkpoint lands where asked."""
    ckpt = tmp_path / "clorch-ddp.ckpt"
    result = clorch.run_local(
        None,
        2,
        "ddp_bf16",
        run_dir=tmp_path / "run",
        epochs=3,
        sample_count=512,
        batch_size=16,
        accumulation=2,
        precision="bfloat16",
        checkpoint_path=str(ckpt),
        optim__lr=0.01,
    )
    records = [r for r in _check_outputs(result) if r["kind"] == "train"]
    assert records[-1]["loss"] < 0.5 * records[0]["loss"], records
    assert ckpt.is_file()
    assert set(result["logs"]) == {0, 1} and "step" in result["logs"][0]["stdout"]


@pytest.mark.timeout(300)
def test_compile_true_compiles_model_and_loss_and_trains_like_eager(tmp_path):
    """compile: true (model and loss through torch.compile) on 2 CPU ranks: the losses follow eager's."""
    tiny = dict(TINY["gpt_bf16"], precision="fp32", epochs=1)
    eager = clorch.run_local(recipe="gpt_bf16", run_dir=tmp_path / "eager", **tiny)
    compiled = clorch.run_local(recipe="gpt_bf16", run_dir=tmp_path / "compiled", compile=True, **tiny)
    losses = [[r["loss"] for r in _check_outputs(result) if r["kind"] == "train"] for result in (eager, compiled)]
    assert len(losses[0]) == len(losses[1]) > 0
    for want, got in zip(*losses):
        assert math.isclose(got, want, rel_tol=1e-3, abs_tol=1e-4)
    assert math.isclose(compiled["summary"]["final"]["eval_loss"], eager["summary"]["final"]["eval_loss"], rel_tol=1e-3)
