"""No process escapes a job: what left a rank's group or session is killed and reaped at the end.

The launching process (here, pytest's) is a child subreaper, so such orphans
are reparented to it; only those of the ending job are ended.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from clorch.launch import launch
from clorch.launch.procs import pid_alive
from tests.launch.procutil import assert_gone

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux's subreaper"),
]


def _escaped_pids(pid_dir: Path, ranks, timeout: float = 30.0) -> list[int]:
    """The pids the ranks wrote to escaped_{rank}.pid, once all are there."""
    deadline = time.monotonic() + timeout
    files = [pid_dir / f"escaped_{r}.pid" for r in ranks]
    while not all(f.exists() for f in files):
        if time.monotonic() > deadline:
            raise AssertionError(f"ranks {list(ranks)} did not write their escaped pids in {timeout}s")
        time.sleep(0.02)
    return [int(f.read_text()) for f in files]


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[1])


def _zombie_children_in(sessions) -> list[int]:
    """Zombie children of this process whose session or group is one of `sessions`."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ppid, pgid, sid = int(fields[1]), int(fields[2]), int(fields[3])
        if fields[0] == "Z" and ppid == os.getpid() and (sid in sessions or pgid in sessions):
            found.append(int(name))
    return found


def _assert_reaped(pids, within: float = 5.0) -> None:
    """Not only dead but reaped: no zombie is left holding the pid."""
    deadline = time.monotonic() + within
    while any(os.path.exists(f"/proc/{pid}") for pid in pids):
        if time.monotonic() > deadline:
            raise AssertionError(f"not reaped after {within}s: {[p for p in pids if os.path.exists(f'/proc/{p}')]}")
        time.sleep(0.02)


@pytest.mark.parametrize(
    "worker, then",
    [
        ("escape_new_session", "return"),
        ("escape_process_group", "raise"),
        ("escape_double_fork", "return"),
        ("escape_double_fork", "raise"),
    ],
)
def test_escaped_process_ends_with_the_job(worker, then, tmp_path):
    job = launch(
        f"tests.launch.workers:{worker}",
        nproc_per_node=2,
        backend=None,
        log_dir=tmp_path / "logs",
        args={"pid_dir": str(tmp_path), "then": then},
        grace_period=2,
    )
    status = job.wait(30)
    assert status["state"] == ("succeeded" if then == "return" else "failed"), status
    escaped = _escaped_pids(tmp_path, [0, 1])
    assert_gone(escaped, within=5)
    _assert_reaped(escaped)
    assert _zombie_children_in(status["pids"]) == []  # the ranks' sentinels and children are reaped too


def test_a_concurrent_job_keeps_its_processes(tmp_path):
    """Job A ends and loses its escaped daemon; job B's ranks and its daemon, orphaned here too, live on."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    b = launch(
        "tests.launch.workers:escape_double_fork",
        nproc_per_node=1,
        backend=None,
        log_dir=tmp_path / "b" / "logs",
        args={"pid_dir": str(tmp_path / "b"), "then": "sleep"},
        grace_period=2,
    )
    with b:
        b_daemon = _escaped_pids(tmp_path / "b", [0])[0]
        # B's daemon is an orphan of this process as A's will be: only the job marker tells them apart.
        assert _parent(b_daemon) == os.getpid()
        a = launch(
            "tests.launch.workers:escape_double_fork",
            nproc_per_node=1,
            backend=None,
            log_dir=tmp_path / "a" / "logs",
            args={"pid_dir": str(tmp_path / "a"), "then": "return"},
        )
        assert a.wait(30)["state"] == "succeeded"
        a_daemon = _escaped_pids(tmp_path / "a", [0])[0]
        assert_gone([a_daemon], within=5)
        _assert_reaped([a_daemon])
        time.sleep(0.5)  # room for a wrong kill to show
        assert pid_alive(b_daemon) and all(pid_alive(p) for p in b.pids)
        assert b.status()["state"] == "running"
        assert b.stop(timeout=20)["state"] == "stopped"
    assert_gone([b_daemon], within=5)
    _assert_reaped([b_daemon])
