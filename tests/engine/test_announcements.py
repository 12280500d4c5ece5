"""The console says what happened: restarts with their cause, resumes, a run already complete,
and the fp16 loss scale on progress lines."""

from __future__ import annotations

import pytest

import clorch
from tests.engine.faulty_worker import FAIL_EXIT_CODE, run_failing

pytestmark = pytest.mark.timeout(180)
BASE = dict(
    recipe="cpu_smoke",
    epochs=2,
    sample_count=128,
    precision="fp16",
    **{"checkpoint": "periodic", "checkpoint.every_n_steps": 2},
)


def test_a_restart_is_announced_with_its_cause_and_the_resume(tmp_path, monkeypatch, capsys):
    result = run_failing(tmp_path / "run", 3, monkeypatch, progress="lines", **{**BASE, "launcher.max_restarts": 1})
    assert result["summary"]["status"] == "succeeded", result["logs"]
    err = capsys.readouterr().err
    assert (
        f"clorch: restart 1 of 1 after rank 1 failed: rank 1 exited with code {FAIL_EXIT_CODE} "
        "and wrote no error file; resuming from the latest checkpoint"
    ) in err
    assert "clorch: resuming from " in err and "step_00000002.ckpt at step 2 (epoch 0)" in err
    assert "loss_scale " in err  # fp16 progress lines show the scale


def test_resuming_a_finished_run_says_it_is_already_complete(tmp_path, capsys):
    first = clorch.run_local(
        run_dir=tmp_path / "a", progress="lines", **{**BASE, "checkpoint.dir": str(tmp_path / "ckpt")}
    )
    assert first["summary"]["status"] == "succeeded"
    capsys.readouterr()
    again = clorch.run_local(
        run_dir=tmp_path / "b",
        progress="lines",
        **{**BASE, "checkpoint.dir": str(tmp_path / "ckpt"), "checkpoint.resume": "latest"},
    )
    assert again["summary"]["status"] == "succeeded"
    steps = first["summary"]["steps"]
    assert (
        f"step_{steps:08d}.ckpt is already at step {steps}, the run's last ({steps}): nothing is left to train"
    ) in capsys.readouterr().err
