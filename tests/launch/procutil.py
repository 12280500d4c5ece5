"""Helpers for the launcher tests: wait for rank pid files, check that processes are gone."""

from __future__ import annotations

import json
import time
from pathlib import Path

from clorch.launch.procs import pid_alive


def wait_for_pid_files(pid_dir: Path, ranks, timeout: float = 30.0) -> dict[int, dict[str, int]]:
    """{rank: {"rank": pid, "grandchild": pid}} once every rank has written its file."""
    deadline = time.monotonic() + timeout
    while True:
        files = {r: Path(pid_dir, f"rank_{r}.json") for r in ranks}
        if all(f.exists() for f in files.values()):
            return {r: json.loads(f.read_text()) for r, f in files.items()}
        if time.monotonic() > deadline:
            raise AssertionError(f"ranks {list(ranks)} did not write their pid files in {timeout}s")
        time.sleep(0.02)


def assert_gone(pids, within: float = 10.0) -> None:
    """Every pid has exited (a zombie counts as exited) within `within` seconds."""
    deadline = time.monotonic() + within
    while any(pid_alive(p) for p in pids):
        if time.monotonic() > deadline:
            alive = [p for p in pids if pid_alive(p)]
            raise AssertionError(f"processes still running after {within}s: {alive}")
        time.sleep(0.02)


def all_pids(pid_files: dict[int, dict[str, int]]) -> list[int]:
    return [pid for entry in pid_files.values() for pid in entry.values()]
