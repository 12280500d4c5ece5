"""One run's resume story, shared by the tests of what a resume keeps: tests/engine/test_reproducible.py
(bit-identical ends) and tests/engine/test_run_history.py (the history's records). Each run is a
2-rank job; made once for the session (CI's budget), on first use.

256 samples over 2 ranks in micro-batches of 16: 8 steps an epoch, 16 in all. Checkpoints every
3 steps; the kill at step 10 is mid-epoch 1, after the checkpoint of step 9, so step 10's records
are trained again. fp16 so the scaler's state must survive too; shuffled sampler, AdamW moments
and a cosine schedule so theirs must as well.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import clorch
from clorch.train.metrics import read_metrics
from tests.engine.faulty_worker import run_failing

BASE = dict(
    recipe="cpu_smoke",
    progress="off",
    epochs=2,
    sample_count=256,
    precision="fp16",
    seed=7,
    **{
        "checkpoint": "periodic",
        "checkpoint.every_n_steps": 3,
        "schedule": "cosine",
        "schedule.warmup_steps": 2,
        "eval_every": 5,
    },
)
KILLED_AT = 10


def run(tmp: Path, name: str, fail_at_step: int | None = None, monkeypatch=None, **overrides) -> dict[str, Any]:
    """BASE with `overrides` in tmp/name (its checkpoints in tmp/ckpt_NAME unless given); with
    `fail_at_step`, the last rank exits abruptly after that step (first attempt)."""
    kwargs = {**BASE, "checkpoint.dir": str(tmp / f"ckpt_{name}"), **overrides}
    if kwargs["checkpoint"] == "none":  # its keys would do nothing: a config error
        kwargs = without_checkpoint_keys(kwargs)
    if fail_at_step is not None:
        return run_failing(tmp / name, fail_at_step, monkeypatch, **kwargs)
    return clorch.run_local(run_dir=tmp / name, **kwargs)


def without_checkpoint_keys(kwargs: dict) -> dict:
    return {k: v for k, v in kwargs.items() if not k.startswith("checkpoint.")}


class ResumeStory:
    """The story's runs in `tmp`: the uninterrupted run ("a"), the run killed after step 10
    ("killed"), its resume in a new directory ("resumed") and the launcher's restart ("restart")."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self._done: dict[str, Any] = {}

    def _failing(self, name: str, **overrides) -> dict[str, Any]:
        with pytest.MonkeyPatch.context() as patch:
            return run(self.tmp, name, fail_at_step=KILLED_AT, monkeypatch=patch, **overrides)

    def uninterrupted(self) -> dict[str, Any]:
        if "a" not in self._done:
            result = run(self.tmp, "a")
            assert result["status"]["state"] == "succeeded", result["logs"]
            self._done["a"] = result
        return self._done["a"]

    def killed(self) -> tuple[dict[str, Any], list[dict]]:
        """The killed run's result and its metrics.jsonl's records as it ended."""
        if "killed" not in self._done:
            result = self._failing("killed")
            self._done["killed"] = result, read_metrics(self.tmp / "killed" / "metrics.jsonl")
        return self._done["killed"]

    def resumed(self) -> dict[str, Any]:
        """checkpoint.resume=latest in the killed run's checkpoint directory, in a new run directory."""
        if "resumed" not in self._done:
            self.killed()
            resumed = {"checkpoint.dir": str(self.tmp / "ckpt_killed"), "checkpoint.resume": "latest"}
            self._done["resumed"] = run(self.tmp, "resumed", **resumed)
        return self._done["resumed"]

    def restart(self) -> dict[str, Any]:
        """The killed run's failure under launcher.max_restarts=1: the launcher restarts the job."""
        if "restart" not in self._done:
            self._done["restart"] = self._failing("restart", **{"launcher.max_restarts": 1})
        return self._done["restart"]
