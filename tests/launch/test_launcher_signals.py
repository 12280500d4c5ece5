"""The launcher process itself ends: SIGKILL, SIGTERM or SIGINT leave no rank or grandchild running."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from clorch.launch import Job
from tests.launch.procutil import all_pids, assert_gone, wait_for_pid_files

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]

# A real launcher process: launches two ranks that each spawn a grandchild, then waits.
LAUNCHER = """
import sys
from clorch.launch import launch
job = launch("tests.launch.workers:grandchild_then", backend=None, log_dir=sys.argv[1],
             args={"pid_dir": sys.argv[2], "then": "sleep"}, grace_period=5)
print(job.wait()["state"], flush=True)
"""


def _start_launcher(tmp_path: Path) -> tuple[subprocess.Popen, list[int], Path]:
    log_dir = tmp_path / "logs"
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(log_dir), str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pids = all_pids(wait_for_pid_files(tmp_path, [0, 1]))
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    return proc, pids, log_dir


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_launcher_signal_leaves_nothing_running(signum, tmp_path):
    launcher, pids, log_dir = _start_launcher(tmp_path)
    launcher.send_signal(signum)
    try:
        out, err = launcher.communicate(timeout=20)
    finally:
        launcher.kill()
    assert launcher.returncode == -signum, err
    assert_gone(pids)
    status = Job.open(log_dir).status()
    assert status["state"] == ("failed" if signum == signal.SIGKILL else "stopped"), status
    if signum == signal.SIGKILL:
        assert "ended without recording the job's end" in status["error"]["message"]
    else:
        assert status["signals"] == [signal.Signals(signum).name] * 2


# The signal arrives while the main thread holds the job's lock (as inside job.status()).
LOCK_HOLDER = """
import os, signal, sys
from clorch.launch import launch
from tests.launch.procutil import wait_for_pid_files
job = launch("tests.launch.workers:grandchild_then", backend=None, log_dir=sys.argv[1],
             args={"pid_dir": sys.argv[2], "then": "sleep"}, grace_period=5)
wait_for_pid_files(sys.argv[2], [0, 1])
with job._lock:
    os.kill(os.getpid(), signal.SIGTERM)
print("handler returned", flush=True)
"""


def test_signal_while_the_job_lock_is_held_does_not_deadlock(tmp_path):
    launcher = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(tmp_path / "logs"), str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = launcher.communicate(timeout=30)
    finally:
        launcher.kill()
    assert launcher.returncode == -signal.SIGTERM, (out, err)
    assert Job.open(tmp_path / "logs").status()["state"] == "stopped"
