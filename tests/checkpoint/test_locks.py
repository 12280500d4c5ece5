"""Two writers of one checkpoint path take turns (each save lands whole); a run owns its
checkpoint directory while it lives, and a second run is refused with the owner named."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from clorch.checkpoint import load_checkpoint, verify_checkpoint
from clorch.checkpoint.locks import DirectoryInUse, DirectoryLock
from tests.clirunner import run_clorch_train

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def test_two_unsynchronised_writers_never_leave_an_unloadable_checkpoint(tmp_path):
    path = tmp_path / "shared.ckpt"
    writers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.checkpoint.concurrent_saver", str(path), str(seed), "25"],
            env=_env(),
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (1, 2)
    ]
    for writer in writers:
        _, err = writer.communicate(timeout=100)
        assert writer.returncode == 0, err
    verify_checkpoint(path)
    model = torch.nn.Linear(64, 64)
    state = load_checkpoint(path, model=model)
    assert state["step"] == 24 and model.weight[0, 0].item() == state["seed"] * 1000 + 24
    assert len(list(tmp_path.glob("shared.ckpt.*.tensors"))) == 1, "the other writer's archives are cleaned"


def _hold_in_a_child(directory: Path) -> subprocess.Popen:
    code = (
        "import sys, time; from pathlib import Path; from clorch.checkpoint.locks import DirectoryLock; "
        "DirectoryLock(Path(sys.argv[1]), {'run_dir': '/runs/first'}).acquire(); "
        "print('held', flush=True); time.sleep(60)"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(directory)], env=_env(), stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline().strip() == "held"
    return child


def test_a_held_directory_is_refused_with_its_owner_and_freed_when_the_owner_dies(tmp_path):
    child = _hold_in_a_child(tmp_path / "ckpt")
    try:
        with pytest.raises(DirectoryInUse) as info:
            DirectoryLock(tmp_path / "ckpt", {"run_dir": "/runs/second"}).acquire()
        assert f"pid {child.pid} on " in str(info.value) and "run directory /runs/first" in str(info.value)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    with DirectoryLock(tmp_path / "ckpt", {}):  # a killed owner leaves no stale lock
        pass


def test_clorch_train_refuses_a_checkpoint_dir_another_run_holds(tmp_path):
    child = _hold_in_a_child(tmp_path / "ckpt")
    try:
        done = run_clorch_train(
            [
                "+recipe=cpu_smoke",
                "checkpoint=periodic",
                "checkpoint.every_n_steps=2",
                f"checkpoint.dir={tmp_path / 'ckpt'}",
                f"hydra.run.dir={tmp_path / 'run'}",
            ],
            tmp_path,
            env=_env(),
            timeout=100,
        )
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert done.returncode == 2, done.stderr
    assert f"checkpoint directory {tmp_path / 'ckpt'} is in use by another run (pid {child.pid}" in done.stderr
    assert not (tmp_path / "run" / "config.yaml").exists(), "nothing was launched"
