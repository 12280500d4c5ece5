"""kill -9 of a real writer process mid-save: the path holds the old or the new checkpoint, never a mix."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from clorch.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from clorch.env import with_multicast_off
from tests.checkpoint.crash_writer import model

pytestmark = pytest.mark.timeout(90)
ROOT = Path(__file__).resolve().parents[2]


def _start(*args: str) -> subprocess.Popen:
    env = with_multicast_off(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.Popen(
        [sys.executable, "-m", "tests.checkpoint.crash_writer", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()
    proc.stderr.close()


def _kill_at(tmp_path: Path, first: str, second: str, point: str) -> None:
    """Run the writer until its second save reaches `point`, then kill -9 it."""
    signal_file = tmp_path.parent / f"{tmp_path.name}-reached"
    proc = _start(str(tmp_path), first, second, "pause", point, str(signal_file))
    try:
        deadline = time.monotonic() + 60
        while not signal_file.exists():
            if proc.poll() is not None:
                pytest.fail(f"writer exited with {proc.returncode} before {point}: {proc.stderr.read()}")
            if time.monotonic() > deadline:
                pytest.fail(f"writer did not reach {point} within 60 s")
            time.sleep(0.02)
    finally:
        _kill(proc)
        signal_file.unlink(missing_ok=True)
    assert proc.returncode == -signal.SIGKILL


def _loads_as(path: Path, seed: int) -> bool:
    target = model(seed + 100)
    state = load_checkpoint(path, model=target)
    expected = model(seed)
    same = all(torch.equal(a, b) for a, b in zip(target.state_dict().values(), expected.state_dict().values()))
    return same and state == {"seed": seed}


def test_killed_while_writing_the_archive(tmp_path):
    _kill_at(tmp_path, "step_00000001.ckpt", "step_00000002.ckpt", "mid_archive")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert any(n.startswith("step_00000002.ckpt.") and n.endswith(".tensors") for n in names), names
    assert "step_00000002.ckpt" not in names
    assert latest_checkpoint(tmp_path) == tmp_path / "step_00000001.ckpt"
    assert _loads_as(tmp_path / "step_00000001.ckpt", 1)


def test_killed_before_the_commit_rename_keeps_the_previous_checkpoint(tmp_path):
    _kill_at(tmp_path, "model.ckpt", "model.ckpt", "before_commit")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len([n for n in names if n.endswith(".tensors")]) == 2 and any(n.endswith(".tmp") for n in names)
    assert _loads_as(tmp_path / "model.ckpt", 1)
    # The next successful save to the same path clears the dead save's leftovers.
    save_checkpoint(tmp_path / "model.ckpt", model=model(5), state={"seed": 5})
    assert len(list(tmp_path.iterdir())) == 2 and _loads_as(tmp_path / "model.ckpt", 5)


def test_killed_after_the_commit_has_the_new_checkpoint(tmp_path):
    _kill_at(tmp_path, "step_00000001.ckpt", "step_00000002.ckpt", "after_commit")
    assert latest_checkpoint(tmp_path) == tmp_path / "step_00000002.ckpt"
    assert _loads_as(tmp_path / "step_00000002.ckpt", 2)
    assert _loads_as(tmp_path / "step_00000001.ckpt", 1)


def test_killed_at_a_random_moment_of_repeated_saves(tmp_path):
    proc = _start(str(tmp_path), "model.ckpt", "model.ckpt", "loop")
    try:
        assert proc.stdout.readline().strip() == "first saved", proc.stderr.read()
        time.sleep(random.uniform(0.2, 0.8))
    finally:
        _kill(proc)
    state = load_checkpoint(tmp_path / "model.ckpt", model=model(0))
    assert state["seed"] >= 1 and _loads_as(tmp_path / "model.ckpt", state["seed"])
