"""`Job.open(log_dir).stop()` from another process escalates to SIGKILL and never waits on a dead launcher."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clorch.launch import Job, launch
from tests.launch.procutil import assert_gone

pytestmark = pytest.mark.timeout(90)
ROOT = Path(__file__).resolve().parents[2]

# Another process stops the job and reports what stop() returned and how long it took.
STOPPER = """
import json, sys, time
from clorch.launch import Job
start = time.monotonic()
timeout = None if sys.argv[2] == "none" else float(sys.argv[2])
status = Job.open(sys.argv[1]).stop(timeout=timeout)
print(json.dumps({"status": status, "seconds": time.monotonic() - start}), flush=True)
"""

# A launcher whose ranks ignore SIGTERM; a long grace period, so only its death can end them soon.
LAUNCHER = """
import sys
from clorch.launch import launch
job = launch("tests.launch.workers:hang_ignoring_sigterm", nproc_per_node=2, backend=None,
             log_dir=sys.argv[1], args={"pid_dir": sys.argv[2]}, grace_period=60)
job.wait()
"""


def _wait_for_ready(pid_dir: Path, ranks, timeout: float = 30.0) -> None:
    """The ranks have installed their SIGTERM-ignoring handler."""
    deadline = time.monotonic() + timeout
    while not all((pid_dir / f"ready_{r}").exists() for r in ranks):
        if time.monotonic() > deadline:
            raise AssertionError(f"ranks {list(ranks)} not ready in {timeout}s")
        time.sleep(0.02)


def _start_stopper(log_dir: Path, timeout: float | None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", STOPPER, str(log_dir), str(timeout).lower()],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stopper_result(stopper: subprocess.Popen) -> dict:
    try:
        out, err = stopper.communicate(timeout=40)
    finally:
        stopper.kill()
    assert stopper.returncode == 0, err
    return json.loads(out)


def _start_launcher(log_dir, tmp_path) -> subprocess.Popen:
    """A separate process that launches the SIGTERM-ignoring job and stays its owner."""
    return subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(log_dir), str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_stop_from_another_process_escalates_to_sigkill(tmp_path):
    with launch(
        "tests.launch.workers:hang_ignoring_sigterm",
        nproc_per_node=2,
        backend=None,
        log_dir=tmp_path / "logs",
        args={"pid_dir": str(tmp_path)},
        grace_period=1,
    ) as job:
        _wait_for_ready(tmp_path, [0, 1])
        pids = job.pids
        result = _stopper_result(_start_stopper(job.log_dir, timeout=30))
        # The grace period (1 s), the SIGKILL, the supervisor's record: well under the 30 s allowed.
        assert result["seconds"] < 10, result
        status = result["status"]
        assert status["state"] == "stopped", status
        assert status["signals"] == ["SIGKILL", "SIGKILL"]
        assert job.wait(5) == status
    assert_gone(pids, within=5)


def test_stop_returns_when_the_launcher_dies_meanwhile(tmp_path):
    """timeout=None: the launcher is SIGKILLed during the grace period; stop() records the end itself."""
    log_dir = tmp_path / "logs"
    launcher = _start_launcher(log_dir, tmp_path)
    try:
        _wait_for_ready(tmp_path, [0, 1])
        pids = Job.open(log_dir).pids
        stopper = _start_stopper(log_dir, timeout=None)
        deadline = time.monotonic() + 20
        while not (log_dir / "stop.request").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        launcher.send_signal(signal.SIGKILL)
        result = _stopper_result(stopper)
    finally:
        launcher.kill()
        launcher.communicate()
    assert result["seconds"] < 20, result  # not the 60 s grace period: the ranks died with the launcher
    status = result["status"]
    assert status["state"] == "stopped", status
    assert "ended without recording the job's end" in status["error"]["message"]
    assert_gone(pids, within=5)
    on_disk = json.loads((log_dir / "job.json").read_text())["status"]
    assert on_disk["state"] == "stopped" and on_disk["ended_at"] is not None


def test_stop_of_a_job_whose_launcher_is_gone_returns_at_once(tmp_path):
    log_dir = tmp_path / "logs"
    launcher = _start_launcher(log_dir, tmp_path)
    try:
        _wait_for_ready(tmp_path, [0, 1])
    finally:
        launcher.kill()
        launcher.communicate()
    start = time.monotonic()
    status = Job.open(log_dir).stop()  # timeout=None
    assert time.monotonic() - start < 5
    assert status["state"] == "failed", status  # it had ended before the stop was asked
    assert json.loads((log_dir / "job.json").read_text())["status"]["state"] == "failed"
