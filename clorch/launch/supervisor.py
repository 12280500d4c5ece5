"""The supervisor thread: start the ranks, watch them, fail fast, time out, restart, clean up.

It waits on one pidfd per rank plus a wake-up pipe, so a rank's exit or a stop
request is seen at once, with no polling interval. It spawns the ranks itself
and lives until the job ends, because Linux delivers a child's parent-death
signal when the *thread* that forked it exits.

The launching process is made a child subreaper before the first rank
starts, so what a rank leaves behind outside its session is reparented here;
each attempt ends by killing and reaping it (`end_leftovers`).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from clorch.status import Status
from clorch._files import unique_token
from clorch.launch.config import LaunchConfig
from clorch.launch.job import STOP_REQUEST, Job
from clorch.launch.procs import (
    become_child_subreaper,
    describe_returncode,
    end_leftovers,
    forget_rank,
    kill_group,
    listen_on_free_port,
    track_rank,
)
from clorch.launch.rendezvous import RendezvousStopped, RendezvousTimeout, meet_nodes
from clorch.launch.spawn import spawn_rank

_NO_PIDFD_POLL_S = 0.02


class _Attempt:
    """One start of the whole group of this node's ranks."""

    def __init__(self, job: Job, config: LaunchConfig, number: int, deadline: float | None, job_id: str) -> None:
        self.job, self.config, self.number, self.deadline = job, config, number, deadline
        self.job_id = job_id
        # Without a port of the user's, rank 0's store takes over a socket listening already;
        # the launcher closes its own copy once rank 0 holds one.
        self.listener = None if config.master_port else listen_on_free_port()
        self.port = config.master_port or self.listener.getsockname()[1]
        self.procs: list[subprocess.Popen] = []
        self.pidfds: dict[int, int] = {}
        self.ending: str | None = None
        self.failed: subprocess.Popen | None = None
        self.kill_at: float | None = None
        self.started_at = time.time()

    def close_listener(self) -> None:
        """Close the launcher's copy of the store's socket (rank 0 has its own from its start)."""
        if self.listener is not None:
            self.listener.close()
            self.listener = None

    def start(self) -> None:
        become_child_subreaper()  # before any rank exists, so that every orphan of theirs comes here
        try:
            for local_rank in range(self.config.nproc_per_node):
                store_fd = (
                    self.listener.fileno() if self.listener and self.config.global_rank(local_rank) == 0 else None
                )
                proc = spawn_rank(self.config, local_rank, self.port, self.number, self.job_id, store_fd)
                track_rank(proc.pid)
                self.procs.append(proc)
                try:
                    self.pidfds[proc.pid] = os.pidfd_open(proc.pid)
                except (AttributeError, OSError):
                    pass  # no pidfd (old kernel): the loop falls back to a short poll
        except BaseException:
            for proc in self.procs:
                kill_group(proc.pid, signal.SIGKILL)
                proc.wait()
            self._end_leftovers()
            raise

    def _end_leftovers(self) -> None:
        """Once every rank is reaped: kill their groups, then what escaped them (see `end_leftovers`)."""
        for proc in self.procs:
            forget_rank(proc.pid)
            kill_group(proc.pid, signal.SIGKILL)
        end_leftovers(self.job_id, [proc.pid for proc in self.procs])

    def _signal_running(self, signum: int) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                kill_group(proc.pid, signum)

    def _end(self, ending: str, signum: int = signal.SIGTERM) -> None:
        """Begin ending the attempt: `signum` to every running rank, SIGKILL after the grace period."""
        self.ending = ending
        self._signal_running(signum)
        self.kill_at = time.monotonic() + self.config.grace_period

    def _first_failure(self, failed: list[subprocess.Popen]) -> subprocess.Popen:
        """Among ranks seen failing together, the one whose error file is oldest, else the lowest."""

        def key(proc: subprocess.Popen) -> tuple[float, int]:
            error = _read_json(self._error_path(proc))
            return (error or {}).get("timestamp", float("inf")), self.procs.index(proc)

        return min(failed, key=key)

    def _error_path(self, proc: subprocess.Popen) -> Path:
        return Path(self.config.log_dir) / f"rank_{self.config.global_rank(self.procs.index(proc))}.error.json"

    def _check(self, newly_exited: list[subprocess.Popen]) -> None:
        failed = [p for p in newly_exited if p.returncode != 0]
        if self.ending is None and failed:
            self.failed = self._first_failure(failed)
            stopped = (Path(self.config.log_dir) / STOP_REQUEST).exists()
            self._end(Status.STOPPED if stopped else Status.FAILED)
        if self.ending is None and self.job._stop_signal is not None:
            self._end(Status.STOPPED, self.job._stop_signal)
        now = time.monotonic()
        if self.ending is None and self.deadline is not None and now >= self.deadline:
            self._end(Status.TIMED_OUT)
        if self.kill_at is not None and now >= self.kill_at:
            self._signal_running(signal.SIGKILL)
            self.kill_at = now + 1.0  # again in a second, should one be slow to go

    def _wait(self, running: list[subprocess.Popen]) -> None:
        now = time.monotonic()
        limits = [t - now for t in (self.deadline if self.ending is None else None, self.kill_at) if t is not None]
        fds = [self.job._wake_r] + [self.pidfds[p.pid] for p in running if p.pid in self.pidfds]
        if len(fds) <= len(running):
            limits.append(_NO_PIDFD_POLL_S)
        ready, _, _ = select.select(fds, [], [], max(0.0, min(limits)) if limits else None)
        if self.job._wake_r in ready:
            os.read(self.job._wake_r, 4096)

    def supervise(self) -> str:
        """Run until every rank has exited; return the attempt's state."""
        reported: set[int] = set()
        while True:
            newly = [p for p in self.procs if p.pid not in reported and p.poll() is not None]
            reported.update(p.pid for p in newly)
            self._check(newly)
            running = [p for p in self.procs if p.returncode is None]
            if not running:
                break
            self._wait(running)
        self._end_leftovers()
        for fd in self.pidfds.values():
            os.close(fd)
        return self.ending or Status.SUCCEEDED

    def error(self) -> dict[str, Any] | None:
        if self.failed is None:
            if self.ending == Status.TIMED_OUT:
                return _error(None, None, None, f"timed out after {self.config.timeout}s (timeout)")
            return None
        rank = self.config.global_rank(self.procs.index(self.failed))
        code, sig = self.failed.returncode, describe_returncode(self.failed.returncode)
        written = _read_json(self._error_path(self.failed))
        if written is not None:
            return {
                **_error(rank, code, sig, written["message"]),
                "type": written["type"],
                "traceback": written["traceback"],
            }
        text = f"killed by {sig}" if sig else f"exited with code {code} and wrote no error file"
        return _error(rank, code, sig, f"rank {rank} {text}")

    def record(self) -> dict[str, Any]:
        return {
            "attempt": self.number,
            "state": self.ending or Status.SUCCEEDED,
            "master_port": self.port,
            "pids": [p.pid for p in self.procs],
            "exit_codes": [p.returncode for p in self.procs],
            "signals": [describe_returncode(p.returncode) for p in self.procs],
            "failed_rank": None if self.failed is None else self.config.global_rank(self.procs.index(self.failed)),
            "error": self.error(),
            "started_at": self.started_at,
            "ended_at": time.time(),
        }


def _error(rank: int | None, code: int | None, sig: str | None, message: str) -> dict[str, Any]:
    return {"rank": rank, "exit_code": code, "signal": sig, "type": None, "message": message, "traceback": None}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _clear_rank_files(config: LaunchConfig) -> None:
    for local_rank in range(config.nproc_per_node):
        rank = config.global_rank(local_rank)
        for suffix in ("error.json", "result.json"):
            (Path(config.log_dir) / f"rank_{rank}.{suffix}").unlink(missing_ok=True)


def _per_rank(config: LaunchConfig, values: list[Any]) -> list[Any]:
    """Index this node's values by global rank; other nodes' ranks are None."""
    out: list[Any] = [None] * config.world_size
    for local_rank, value in enumerate(values):
        out[config.global_rank(local_rank)] = value
    return out


def _results(config: LaunchConfig) -> list[Any]:
    return _per_rank(
        config,
        [
            _read_json(Path(config.log_dir) / f"rank_{config.global_rank(r)}.result.json")
            for r in range(config.nproc_per_node)
        ],
    )


def _publish_end(job: Job, config: LaunchConfig, attempts: list[dict[str, Any]]) -> None:
    last = attempts[-1]
    job._update(
        state=last["state"],
        attempts=attempts,
        exit_codes=_per_rank(config, last["exit_codes"]),
        signals=_per_rank(config, last["signals"]),
        failed_rank=last["failed_rank"],
        error=last["error"],
        results=_results(config),
        ended_at=last["ended_at"],
    )


def _meet_other_nodes(job: Job, config: LaunchConfig, number: int, attempts: list[dict[str, Any]]) -> bool:
    """With nnodes > 1, wait for the other nodes' launchers before starting the ranks.

    Returns False when they did not come (or the job was stopped meanwhile),
    after recording the job's end with the reason.
    """
    if config.nnodes == 1:
        return True
    try:
        meet_nodes(
            config.master_addr,
            config.master_port,
            config.nnodes,
            config.node_rank,
            config.rdzv_timeout,
            stopped=lambda: job._stop_signal is not None,
        )
        return True
    except (RendezvousTimeout, RendezvousStopped) as exc:
        stopped = isinstance(exc, RendezvousStopped)
        now = time.time()
        error = None if stopped else {**_error(None, None, None, str(exc)), "type": "RendezvousTimeout"}
        attempts.append(
            {
                "attempt": number,
                "state": Status.STOPPED if stopped else Status.FAILED,
                "master_port": config.master_port,
                "pids": [],
                "exit_codes": [None] * config.nproc_per_node,
                "signals": [None] * config.nproc_per_node,
                "failed_rank": None,
                "error": error,
                "started_at": now,
                "ended_at": now,
            }
        )
        _publish_end(job, config, attempts)
        return False


def run_job(job: Job, config: LaunchConfig) -> None:
    """The supervisor thread's body: attempts until success, a final failure, a stop or the timeout."""
    deadline = None if config.timeout is None else time.monotonic() + config.timeout
    attempts: list[dict[str, Any]] = []
    job_id = unique_token()  # marks this job's processes apart from other jobs of this process
    try:
        (Path(config.log_dir) / STOP_REQUEST).unlink(missing_ok=True)
        for number in range(config.max_restarts + 1):
            _clear_rank_files(config)
            if not _meet_other_nodes(job, config, number, attempts):
                return
            attempt = _Attempt(job, config, number, deadline, job_id)
            try:
                attempt.start()
            finally:
                attempt.close_listener()
                job._update(pids=[p.pid for p in attempt.procs], master_port=attempt.port, restart_count=number)
            state = attempt.supervise()
            attempts.append(attempt.record())
            job._update(attempts=attempts)
            out_of_time = deadline is not None and time.monotonic() >= deadline
            if state != Status.FAILED or job._stop_signal is not None or out_of_time:
                break
        _publish_end(job, config, attempts)
    except BaseException as exc:  # the job must end, and say why, whatever went wrong here
        job._update(
            state=Status.FAILED,
            attempts=attempts,
            error=_error(None, None, None, f"the launcher failed: {type(exc).__name__}: {exc}"),
        )
        raise
    finally:
        job._finish()
