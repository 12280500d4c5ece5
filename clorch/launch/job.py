"""The job handle: status, waiting, logs, stopping, and the JSON record on disk.

The launching process owns the job (a supervisor thread watches the ranks);
any other process can `Job.open(log_dir)` the record `job.json` and read the
same status and logs, or stop the job: on the launcher's host it signals the
ranks itself and escalates to SIGKILL as the supervisor would.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

from clorch._files import write_json_atomic
from clorch.launch.procs import kill_group, pid_alive
from clorch.status import Status

RECORD = "job.json"
STOP_REQUEST = "stop.request"
FINAL_STATES = (Status.SUCCEEDED, Status.FAILED, Status.STOPPED, Status.TIMED_OUT)
_OBSERVER_POLL_S = 0.05


class Job:
    """A launched job. Returned by `clorch.launch.launch`; also `Job.open(log_dir)`.

    A context manager: leaving the with-block stops the job if it still runs.
    """

    def __init__(self, log_dir: Path, record: dict[str, Any], owner: bool) -> None:
        self.log_dir = Path(log_dir)
        self._record = record
        self._owner = owner
        # Reentrant: the signal handler (_request_stop) runs on the main thread, which may
        # already hold the lock (e.g. inside status()); a plain Lock would deadlock there.
        self._lock = threading.RLock()
        self._done = threading.Event()
        self._stop_signal: int | None = None
        self._wake_r, self._wake_w = os.pipe() if owner else (-1, -1)
        if owner:
            os.set_blocking(self._wake_w, False)  # a full pipe already means "wake up"
        self._thread: threading.Thread | None = None

    # -- reading -------------------------------------------------------------
    @classmethod
    def open(cls, log_dir: str | os.PathLike) -> "Job":
        """Attach to the job whose record is in `log_dir` (from any process).

        Raises:
            ValueError: `log_dir` holds no job record, or one that cannot be read.
        """
        path = Path(log_dir) / RECORD
        if not path.is_file():
            raise ValueError(f"log_dir {str(log_dir)!r} holds no job record ({RECORD})")
        try:
            record = json.loads(path.read_text())
            record["status"]["state"]
        except (ValueError, KeyError, TypeError) as exc:
            # The launcher writes it atomically: a damaged one was cut or edited by something else.
            raise ValueError(
                f"the job record {path} cannot be read ({type(exc).__name__}: {exc}); it is "
                "damaged (clorch writes it whole), so this job cannot be followed"
            ) from None
        return cls(Path(log_dir), record, owner=False)

    def _read_record(self) -> dict[str, Any]:
        if self._owner:
            with self._lock:
                return copy.deepcopy(self._record)
        record = json.loads((self.log_dir / RECORD).read_text())
        status = record["status"]
        if status["state"] == Status.RUNNING and self._launcher_gone(record):
            # The launcher died without writing the end; its ranks died with it (PDEATHSIG).
            # "stopped" when someone had asked for that, since the ranks are gone as asked.
            stopped = (self.log_dir / STOP_REQUEST).exists()
            status.update(
                state=Status.STOPPED if stopped else Status.FAILED,
                error={
                    "rank": None,
                    "type": None,
                    "traceback": None,
                    "exit_code": None,
                    "signal": None,
                    "message": f"the launcher (pid {record['launcher_pid']}) ended without recording "
                    "the job's end; its ranks were killed with it",
                },
            )
        return record

    @staticmethod
    def _launcher_gone(record: dict[str, Any]) -> bool:
        """The launcher is known to have died (only on its own host: a pid means nothing elsewhere)."""
        return record.get("host") == socket.gethostname() and not pid_alive(record["launcher_pid"])

    def status(self) -> dict[str, Any]:
        """The job's status now; see `clorch.launch.job_status`."""
        return self._read_record()["status"]

    @property
    def pids(self) -> list[int]:
        """Process ids of this node's ranks in the current (or last) attempt."""
        return list(self.status()["pids"])

    @property
    def config(self) -> dict[str, Any]:
        """The validated launch arguments, as stored in the record."""
        return copy.deepcopy(self._record["config"])

    def done(self) -> bool:
        return self.status()["state"] in FINAL_STATES

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Block until the job ends; return its final status. See `await_job`."""
        if self._owner:
            if not self._done.wait(timeout):
                raise TimeoutError(f"job in {str(self.log_dir)!r} still running after timeout={timeout}s")
            return self.status()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status()
            if status["state"] in FINAL_STATES:
                return status
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job in {str(self.log_dir)!r} still running after timeout={timeout}s")
            time.sleep(_OBSERVER_POLL_S)

    def logs(self, rank: int) -> dict[str, str]:
        """`{"stdout": ..., "stderr": ...}` of `rank`, read from its files; see `job_logs`."""
        ranks = self._record["status"]["ranks"]
        if not isinstance(rank, int) or rank not in ranks:
            raise ValueError(f"rank must be one of this node's ranks {ranks}, got {rank!r}")
        out = {}
        for stream in ("stdout", "stderr"):
            path = self.log_dir / f"rank_{rank}.{stream}"
            out[stream] = path.read_text(errors="replace") if path.exists() else ""
        return out

    # -- stopping ------------------------------------------------------------
    def stop(self, timeout: float | None = None) -> dict[str, Any]:
        """Cancel the job (SIGTERM, then SIGKILL after the grace period); return the final status.

        In the launching process this asks the supervisor thread to do it. In
        any other process on the launcher's host, this process does it: it
        leaves a stop request (so the end is recorded as "stopped"), sends
        SIGTERM to every rank's process group, SIGKILL after the job's
        grace_period (again each second while a rank still runs), then waits
        for the launcher to record the end. If the launcher is gone, the ranks
        died with it: the end is recorded here and returned, so a stop never
        waits on a launcher that cannot answer. From another host no rank can
        be signalled: the stop request is left and the job's end awaited.

        Blocks until the job has ended, or for at most `timeout` seconds.

        Raises:
            TimeoutError: the job still runs after `timeout` seconds. From
                another process, a timeout shorter than the grace period
                returns before the SIGKILL, and then nobody sends it.
        """
        if self._owner:
            self._request_stop(signal.SIGTERM)
            return self.wait(timeout)
        return self._stop_from_outside(timeout)

    def _stop_from_outside(self, timeout: float | None) -> dict[str, Any]:
        """`stop` in a process that does not own the job (see there)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        record = self._read_record()
        if record["status"]["state"] == Status.RUNNING:
            (self.log_dir / STOP_REQUEST).write_text(str(os.getpid()))
            self._signal_ranks(record, signal.SIGTERM)
        kill_at = time.monotonic() + record["config"]["grace_period"]
        while True:
            record = self._read_record()
            if record["status"]["state"] in FINAL_STATES:
                return self._settle(record)["status"]
            now = time.monotonic()
            if now >= kill_at:
                self._signal_ranks(record, signal.SIGKILL)
                kill_at = now + 1.0  # again in a second, as the supervisor does, should one be slow to go
            if deadline is not None and now >= deadline:
                raise TimeoutError(f"job in {str(self.log_dir)!r} still running after timeout={timeout}s")
            time.sleep(_OBSERVER_POLL_S)

    @staticmethod
    def _signal_ranks(record: dict[str, Any], signum: int) -> None:
        """`signum` to the process group of each rank of `record` that still runs (its launcher's child)."""
        if record.get("host") != socket.gethostname():
            return  # its pids name other processes here
        for pid in record["status"]["pids"]:
            if _is_rank_of(pid, record["launcher_pid"]):
                kill_group(pid, signum)

    def _settle(self, record: dict[str, Any]) -> dict[str, Any]:
        """Write down an end that only this reader saw (the launcher died first); return `record`.

        Once written, the end no longer depends on the launcher's pid, which
        the system may give to another process later.
        """
        on_disk = json.loads((self.log_dir / RECORD).read_text())
        if on_disk["status"]["state"] == Status.RUNNING and self._launcher_gone(on_disk):
            record["status"]["ended_at"] = record["status"]["ended_at"] or time.time()
            write_json_atomic(self.log_dir / RECORD, record, indent=1)
        return record

    def _request_stop(self, signum: int) -> None:
        """Ask the supervisor to end the job with `signum` (forwarded), escalating to SIGKILL."""
        with self._lock:
            if self._stop_signal is None:
                self._stop_signal = signum
            # Under the lock: the supervisor closes the pipe under it once the job has ended.
            if not self._done.is_set():
                try:
                    os.write(self._wake_w, b"s")
                except BlockingIOError:
                    pass  # the pipe is full of wake-ups already

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.done():
            self.stop()

    def __repr__(self) -> str:
        return f"Job(log_dir={str(self.log_dir)!r}, state={self.status()['state']!r})"

    # -- writing (the owning process's supervisor) ---------------------------
    def _finish(self) -> None:
        """Mark the job ended and release the wake-up pipe (the supervisor, once)."""
        with self._lock:
            self._done.set()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _update(self, **status: Any) -> None:
        with self._lock:
            self._record["status"].update(copy.deepcopy(status))
            snapshot = copy.deepcopy(self._record)
        write_json_atomic(self.log_dir / RECORD, snapshot, indent=1)


def _is_rank_of(pid: int, launcher_pid: int) -> bool:
    """Guard against pid reuse: only a live child of the launcher leading its own session is a rank.

    Checked on the process itself, not its command line, which a rank may
    rewrite (setproctitle).
    """
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    state, ppid, sid = fields[0], int(fields[1]), int(fields[3])
    return state not in ("Z", "X") and ppid == launcher_pid and sid == pid
