"""Reproducible runs on CPU over gloo (2 ranks): same config and seed, same metrics and weights;
a run killed mid-epoch and resumed (by hand, or by the launcher's restart) ends bit-identical."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import clorch
from clorch.train.metrics import read_metrics, without_timing
from tests.harness import free_port
from tests.engine.faulty_worker import FAIL_EXIT_CODE
from tests.engine.resume_story import BASE, run, without_checkpoint_keys

pytestmark = pytest.mark.timeout(200)

# The job (BASE: 16 steps, a checkpoint every 3, the kill after step 10) and its uninterrupted, killed,
# resumed and restarted runs are tests.engine.resume_story's, shared with tests/engine/test_run_history.py;
# this module's other runs sit beside them in the story's directory.


def _metrics(result) -> list[dict]:
    return without_timing(read_metrics(Path(result["run_dir"]) / "metrics.jsonl"))


@pytest.fixture
def uninterrupted(resume_story):
    return resume_story.tmp, resume_story.uninterrupted()


def test_same_config_same_metrics_and_weights(uninterrupted):
    tmp, first = uninterrupted
    second = run(tmp, "b")
    assert second["status"]["state"] == "succeeded", second["logs"]
    metrics = _metrics(first)
    assert [r["step"] for r in metrics if r["kind"] == "train"] == [2, 4, 6, 8, 10, 12, 14, 16]
    assert [r["step"] for r in metrics if r["kind"] == "eval"] == [5, 10, 15, 16]  # and the final one
    assert metrics == _metrics(second)
    assert first["summary"]["weights_sha256"] == second["summary"]["weights_sha256"]
    assert first["summary"]["final"]["eval_loss"] == second["summary"]["final"]["eval_loss"]
    # Each rank wrote its logs; the summary and the outputs are all there.
    assert set(first["logs"]) == {0, 1}
    for name in ("config.yaml", "env.json", "summary.json", "metrics.jsonl"):
        assert (Path(first["run_dir"]) / name).is_file(), name
    assert (tmp / "ckpt_a" / "final.ckpt").is_file()


def test_a_different_seed_gives_different_weights(uninterrupted):
    tmp, first = uninterrupted
    other = run(tmp, "seed", seed=8, epochs=1, **{"checkpoint": "none"})
    assert other["status"]["state"] == "succeeded", other["logs"]
    assert other["summary"]["weights_sha256"] != first["summary"]["weights_sha256"]


def test_killed_mid_epoch_then_resumed_is_bit_identical(uninterrupted, resume_story):
    tmp, first = uninterrupted
    killed, _ = resume_story.killed()
    status = killed["status"]
    assert status["state"] == "failed" and status["failed_rank"] == 1
    assert status["exit_codes"][1] == FAIL_EXIT_CODE
    assert killed["summary"]["status"] == "failed"
    resumed = resume_story.resumed()  # checkpoint.resume=latest in the killed run's checkpoint directory
    assert resumed["status"]["state"] == "succeeded", resumed["logs"]
    assert resumed["summary"]["resumed_from"].endswith("step_00000009.ckpt")
    assert "resumed from" in resumed["logs"][0]["stdout"]
    after = [r for r in _metrics(first) if r["step"] > 9]
    new_records = [r for r in _metrics(resumed) if r["step"] > 9]
    assert new_records == after
    # The resumed run's record is the whole run's: the killed run's records up to step 9 first.
    assert _metrics(resumed) == _metrics(first)
    assert resumed["summary"]["weights_sha256"] == first["summary"]["weights_sha256"]
    assert resumed["summary"]["final"]["eval_loss"] == first["summary"]["final"]["eval_loss"]


def test_launcher_restart_resumes_from_latest_checkpoint(uninterrupted, resume_story):
    tmp, first = uninterrupted
    result = resume_story.restart()  # killed after step 10 under launcher.max_restarts=1
    assert result["status"]["state"] == "succeeded", result["logs"]
    assert result["summary"]["attempts"] == 2
    # The restarted job trimmed its metrics back to the checkpoint: the file
    # is the uninterrupted run's, line for line.
    assert _metrics(result) == _metrics(first)
    assert result["summary"]["weights_sha256"] == first["summary"]["weights_sha256"]
    summary = json.loads((Path(result["run_dir"]) / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["steps"] == 16


def test_resume_latest_after_the_end_trains_nothing_more(uninterrupted):
    tmp, first = uninterrupted
    again = run(tmp, "again", **{"checkpoint.dir": str(tmp / "ckpt_a"), "checkpoint.resume": "latest"})
    assert again["status"]["state"] == "succeeded", again["logs"]
    assert again["summary"]["resumed_from"].endswith("step_00000016.ckpt")
    assert again["summary"]["weights_sha256"] == first["summary"]["weights_sha256"]
    assert sorted(p.name for p in (tmp / "ckpt_a").glob("step_*.ckpt")) == [
        "step_00000015.ckpt",
        "step_00000016.ckpt",
    ]  # keep_last=2


def test_torchrun_agent_restart_resumes_from_latest_checkpoint(uninterrupted, monkeypatch):
    """launcher=torchrun: torch's elastic agent restarts the ranks, which resume as clorch's own do."""
    tmp, first = uninterrupted
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))  # the agent's ranks import tests.*
    result = run(
        tmp,
        "agent",
        fail_at_step=10,
        monkeypatch=monkeypatch,
        **{
            "launcher": "torchrun",
            "launcher.max_restarts": 1,
            "launcher.rdzv_endpoint": f"127.0.0.1:{free_port()}",
        },
    )
    assert result["summary"]["status"] == "succeeded", result["summary"]
    assert result["summary"]["attempts"] == 2
    assert _metrics(result) == _metrics(first)
    assert result["summary"]["weights_sha256"] == first["summary"]["weights_sha256"]


def test_step_in_backward_and_bucket_views_train_the_same_weights(tmp_path):
    """ddp.step_in_backward=true (optimizer stepped bucket by bucket) and
    ddp.gradient_as_bucket_view=true (backward accumulates into the buckets) end with the same weights."""
    common = dict(
        without_checkpoint_keys(BASE),
        precision="bf16",
        epochs=1,
        checkpoint="none",
        **{"ddp.bucket_cap_mb": 0.01, "ddp.first_bucket_cap_mb": 0.01},
    )
    variants = ({}, {"ddp.step_in_backward": True}, {"ddp.gradient_as_bucket_view": True})
    runs = [clorch.run_local(run_dir=tmp_path / str(i), **common, **extra) for i, extra in enumerate(variants)]
    for result in runs:
        assert result["status"]["state"] == "succeeded", result["logs"]
    for other in runs[1:]:
        assert other["summary"]["weights_sha256"] == runs[0]["summary"]["weights_sha256"]
        assert _metrics(other) == _metrics(runs[0])
