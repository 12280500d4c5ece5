"""Fail-fast, signals, exit codes, timeouts, restarts: each ending is reported and cleaned up."""

from __future__ import annotations

import time

import pytest

from clorch.launch import launch
from tests.launch.procutil import all_pids, assert_gone, wait_for_pid_files

pytestmark = pytest.mark.timeout(90)


def test_fail_fast_in_a_real_gloo_group(tmp_path):
    """Rank 1 raises; rank 0 sleeps outside any collective and must be ended by the launcher."""
    start = time.monotonic()
    with launch(
        "tests.launch.workers:gloo_fail_fast",
        nproc_per_node=2,
        backend="gloo",
        log_dir=tmp_path / "logs",
        args={"pid_dir": str(tmp_path)},
        grace_period=5,
    ) as job:
        status = job.wait(60)
    # Well under a collective timeout (30 min) and under rank 0's 120 s sleep.
    assert time.monotonic() - start < 45
    assert status["state"] == "failed"
    assert status["failed_rank"] == 1
    assert status["exit_codes"] == [-15, 1] and status["signals"] == ["SIGTERM", None]
    error = status["error"]
    assert (error["rank"], error["type"], error["exit_code"]) == (1, "ValueError", 1)
    assert error["message"] == "rank 1 gave up after the first all_reduce"
    assert "in gloo_fail_fast" in error["traceback"] and "ValueError" in error["traceback"]
    assert "rank 1 gave up" in job.logs(1)["stderr"]  # Python's own traceback, on disk
    assert (tmp_path / "logs" / "rank_1.error.json").exists()
    assert_gone(all_pids(wait_for_pid_files(tmp_path, [0])) + status["pids"])


def test_exit_code_signal_name_and_last_output(tmp_path):
    """sys.exit(3) keeps its code; a segfault is named and its last unflushed line survives."""
    exits = launch(
        "tests.launch.workers:exit_with", backend=None, args={"code": 3}, log_dir=tmp_path / "exit", grace_period=2
    )
    crash = launch("tests.launch.workers:segfault", backend=None, log_dir=tmp_path / "crash", grace_period=2)
    with exits, crash:
        exit_status, crash_status = exits.wait(30), crash.wait(30)
    assert exit_status["state"] == "failed" and exit_status["failed_rank"] == 1
    assert exit_status["exit_codes"] == [-15, 3]
    assert (exit_status["error"]["type"], exit_status["error"]["message"]) == ("SystemExit", "sys.exit(3)")
    assert crash_status["failed_rank"] == 1
    assert crash_status["exit_codes"][1] == -11 and crash_status["signals"] == ["SIGTERM", "SIGSEGV"]
    assert crash_status["error"]["message"] == "rank 1 killed by SIGSEGV"
    assert crash_status["error"]["signal"] == "SIGSEGV" and crash_status["error"]["type"] is None
    assert crash.logs(1)["stdout"] == "last words before the crash\n"


def test_hung_rank_times_out_and_sigterm_escalates_to_sigkill(tmp_path):
    start = time.monotonic()
    with launch(
        "tests.launch.workers:hang_ignoring_sigterm",
        backend=None,
        timeout=1.5,
        grace_period=0.5,
        log_dir=tmp_path / "logs",
        args={"pid_dir": str(tmp_path)},
    ) as job:
        status = job.wait(30)
    elapsed = time.monotonic() - start
    assert status["state"] == "timed_out"
    assert status["signals"] == ["SIGKILL", "SIGKILL"]
    assert status["failed_rank"] is None and "timed out after 1.5s" in status["error"]["message"]
    assert 1.5 + 0.5 <= elapsed < 15
    assert_gone(status["pids"])


def test_fail_fast_grace_period_and_grandchildren(tmp_path):
    """Rank 1 raises; rank 0 sleeps: SIGTERM ends it at once, its grandchild goes too."""
    with launch(
        "tests.launch.workers:grandchild_then",
        backend=None,
        log_dir=tmp_path / "logs",
        args={"pid_dir": str(tmp_path), "then": "raise"},
        grace_period=30,
    ) as job:
        pids = all_pids(wait_for_pid_files(tmp_path, [0, 1]))
        start = time.monotonic()
        status = job.wait(30)
    assert time.monotonic() - start < 10, "SIGTERM ends a plain sleeping rank without the grace period"
    assert status["failed_rank"] == 1 and status["error"]["message"] == "rank 1 gave up"
    assert_gone(pids)


def test_restarts_as_a_whole_group(tmp_path):
    recovers = launch(
        "tests.launch.workers:flaky",
        backend=None,
        max_restarts=2,
        args={"succeed_at": 2},
        log_dir=tmp_path / "recovers",
    )
    gives_up = launch(
        "tests.launch.workers:flaky",
        backend=None,
        max_restarts=1,
        args={"succeed_at": 5},
        log_dir=tmp_path / "gives_up",
    )
    with recovers, gives_up:
        ok, failed = recovers.wait(60), gives_up.wait(60)
    assert ok["state"] == "succeeded" and ok["restart_count"] == 2
    assert [a["state"] for a in ok["attempts"]] == ["failed", "failed", "succeeded"]
    ports = [a["master_port"] for a in ok["attempts"]]
    assert len(set(ports)) == 3, f"each restart gets a fresh port, got {ports}"
    assert [r["restart"] for r in ok["results"]] == [2, 2]
    assert {r["port"] for r in ok["results"]} == {ports[-1]}
    assert ok["attempts"][0]["error"]["message"] == "attempt 0 fails on purpose"
    assert "=== clorch: restart 2 of 2 ===" in recovers.logs(0)["stdout"]
    assert failed["state"] == "failed" and len(failed["attempts"]) == 2
    assert failed["error"]["message"] == "attempt 1 fails on purpose"
    assert failed["results"] == [None, None]
