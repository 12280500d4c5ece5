"""`python -m clorch.launch`: its exit code follows the documented policy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "clorch.launch", "--backend", "none", "--grace-period", "2", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_exit_codes(tmp_path):
    runs = {
        "ok": _cli("--log-dir", str(tmp_path / "ok"), "--args", '{"x": 1}', "tests.launch.workers:report"),
        "exit3": _cli("--log-dir", str(tmp_path / "e"), "--args", '{"code": 3}', "tests.launch.workers:exit_with"),
        "segv": _cli("--log-dir", str(tmp_path / "s"), "tests.launch.workers:segfault"),
        "raise": _cli("--log-dir", str(tmp_path / "r"), "--args", '{"succeed_at": 1}', "tests.launch.workers:flaky"),
        "timeout": _cli(
            "--log-dir",
            str(tmp_path / "t"),
            "--timeout",
            "0.5",
            "--args",
            f'{{"pid_dir": "{tmp_path}"}}',
            "tests.launch.workers:hang_ignoring_sigterm",
        ),
        "invalid": _cli("--nnodes", "0", "tests.launch.workers:report"),
    }
    results = {name: (proc.communicate(timeout=50), proc.returncode) for name, proc in runs.items()}
    codes = {name: code for name, (_, code) in results.items()}
    assert codes == {"ok": 0, "exit3": 3, "segv": 128 + 11, "raise": 1, "timeout": 124, "invalid": 2}, results
    assert "job failed (rank 1: rank 1 killed by SIGSEGV)" in results["segv"][0][1]
    assert "nnodes must be an integer >= 1, got 0" in results["invalid"][0][1]
    assert "logs in " + str(tmp_path / "ok") in results["ok"][0][1]
