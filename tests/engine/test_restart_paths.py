"""The launching process's side of restarts and reused directories, in-process (nothing launches):
which checkpoint a restarted rank starts from, following a rewritten metrics.jsonl, stopping
the ranks when following fails, and refusing a run directory that holds another run's checkpoints."""

from __future__ import annotations

import io
import json

import pytest

from clorch.checkpoint.policy import Latest
from clorch.config import ConfigError, TrainConfig, compose
from clorch.config.schema import CheckpointConfig
from clorch.plan.plan import resolve
from clorch.engine import run
from clorch.train import checkpoints
from clorch.engine.progress import Progress
from clorch.strategies import ddp as ddp_strategy

pytestmark = pytest.mark.timeout(60)


def _ckpt_cfg(directory, resume):
    return TrainConfig(checkpoint=CheckpointConfig(dir=str(directory), resume=resume))


def test_restart_uses_the_latest_checkpoint_else_the_configured_resume_path(tmp_path, monkeypatch):
    directory, explicit = tmp_path / "ckpt", tmp_path / "other" / "step_00000004.ckpt"
    newest = directory / "step_00000006.ckpt"
    found = {}
    # parallel=ddp's strategy finds the newest checkpoint file (clorch.strategies.ddp)
    monkeypatch.setattr(ddp_strategy, "find_latest_checkpoint", lambda d: Latest(found.get(str(d)), []))
    monkeypatch.setenv("CLORCH_RESTART_COUNT", "1")
    directory.mkdir()
    # No checkpoint of this job yet: the restart starts as the first attempt did.
    assert checkpoints.resume_path(_ckpt_cfg(directory, str(explicit)), tmp_path) == explicit
    assert checkpoints.resume_path(_ckpt_cfg(directory, "none"), tmp_path) is None
    assert checkpoints.resume_path(_ckpt_cfg(directory, "latest"), tmp_path) is None
    # Once the job has written one, the restart continues from it.
    found[str(directory)] = newest
    for resume in (str(explicit), "none", "latest"):
        assert checkpoints.resume_path(_ckpt_cfg(directory, resume), tmp_path) == newest
    monkeypatch.setenv("CLORCH_RESTART_COUNT", "0")
    assert checkpoints.resume_path(_ckpt_cfg(directory, str(explicit)), tmp_path) == explicit


def _line(step, loss):
    return json.dumps({"kind": "train", "step": step, "loss": loss}) + "\n"


def test_progress_survives_a_rewritten_metrics_file_and_bad_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    stream = io.StringIO()
    progress = Progress(path, total_steps=40, mode="lines", stream=stream)
    path.write_text(_line(10, 0.91) + _line(20, 0.82) + _line(30, 0.73))
    progress.poll()
    # A restart resumed at step 20: MetricsWriter keeps steps <= 20 (a shorter file), then appends.
    path.write_text(_line(10, 0.91) + _line(20, 0.82))
    progress.poll()
    with open(path, "a") as f:
        f.write("{not json\n" + _line(30, 0.73) + _line(40, 0.64))
    progress.poll()
    progress.close()
    lines = stream.getvalue().splitlines()
    assert lines == ["step 10/40  loss 0.91", "step 20/40  loss 0.82", "step 30/40  loss 0.73", "step 40/40  loss 0.64"]


def test_progress_rereads_a_file_rewritten_to_the_same_length_or_longer(tmp_path):
    path = tmp_path / "metrics.jsonl"
    stream = io.StringIO()
    progress = Progress(path, total_steps=9, mode="lines", stream=stream)
    path.write_text(_line(1, 0.5))
    progress.poll()
    # Rewritten and grown past the old offset before the next poll: the offset is mid-line.
    path.write_text(json.dumps({"kind": "train", "step": 1, "loss": 0.5, "lr": 0.1}) + "\n" + _line(2, 0.4))
    progress.poll()
    assert stream.getvalue().splitlines() == ["step 1/9  loss 0.5", "step 2/9  loss 0.4"]


class _Job:
    config = {"max_restarts": 0}

    def __init__(self):
        self.stopped = False

    def wait(self, timeout):
        raise TimeoutError

    def status(self):
        return {"restart_count": 0, "attempts": []}

    def stop(self):
        self.stopped = True


class _BrokenProgress:
    def poll(self):
        raise RuntimeError("progress view failed")

    def close(self):
        pass


def test_follow_stops_the_ranks_when_following_fails():
    job = _Job()
    with pytest.raises(RuntimeError, match="progress view failed"):
        run._follow(job, _BrokenProgress())
    assert job.stopped


def test_the_plan_refuses_a_run_dir_holding_another_runs_checkpoints(tmp_path, monkeypatch):
    monkeypatch.delenv("CLORCH_RESTART_COUNT", raising=False)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "step_00000002.ckpt").write_text("{}")
    cfg = compose(["+recipe=cpu_smoke", "checkpoint=periodic", "checkpoint.every_n_steps=2"])
    with pytest.raises(ConfigError) as info:
        run.execute(resolve(cfg, tmp_path), tmp_path, progress="off", echo=False)
    assert info.value.errors == [
        f"checkpoint.dir={tmp_path / 'checkpoints'} already holds checkpoints (step_00000002.ckpt); "
        "pass checkpoint.resume=latest to continue that run, or choose an empty directory"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints"]  # nothing launched or written


def _agreed(rank: int, world_size: int, directory: str) -> str | None:
    from pathlib import Path

    # Each rank is configured (or sees files) differently; rank 0's choice must win everywhere.
    cfg = _ckpt_cfg(directory, f"{directory}/from_rank_{rank}.ckpt")
    path = checkpoints.agreed_resume_path(cfg, Path(directory))
    return None if path is None else str(path)


def test_every_rank_resumes_from_rank_zeros_choice(tmp_path):
    from tests.harness import run_ranks

    paths = run_ranks(_agreed, 2, str(tmp_path), timeout=60)
    assert paths == [f"{tmp_path}/from_rank_0.ckpt"] * 2


def test_auto_progress_draws_a_bar_only_on_a_terminal_with_a_width(tmp_path):
    import fcntl
    import os
    import struct
    import termios

    from clorch.engine.progress import Progress

    master, slave = os.openpty()  # a new pty reports 0 x 0 until someone sets its size
    with os.fdopen(slave, "w") as stream:
        try:
            assert Progress(tmp_path / "metrics.jsonl", 10, stream=stream).mode == "lines"
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
            progress = Progress(tmp_path / "metrics.jsonl", 10, stream=stream)
            assert progress.mode == "bar"
            progress.close()
        finally:
            os.close(master)
