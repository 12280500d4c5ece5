"""SIGINT/SIGTERM to the launcher: forward to every live job's ranks, then act as before.

Installed by `launch()` when it is called from the main thread. The handler
asks each live job's supervisor to forward the signal to its ranks' process
groups (SIGKILL follows after the grace period), then:
* a previous Python handler (SIGINT's default raises KeyboardInterrupt) runs;
* a default action (SIGTERM's: terminate) runs once the jobs have ended, so
  the launcher still dies "by SIGTERM" (exit status 143 in a shell);
* an ignored signal stays ignored and is not forwarded.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clorch.launch.job import Job

FORWARDED = (signal.SIGINT, signal.SIGTERM)
_live: set["Job"] = set()
_live_lock = threading.RLock()  # reentrant: _forward runs in a signal handler on the main thread
_previous: dict[int, Any] = {}


def register(job: "Job") -> None:
    with _live_lock:
        _live.add(job)


def unregister(job: "Job") -> None:
    with _live_lock:
        _live.discard(job)


def install() -> None:
    """Install the forwarding handlers once per process; only the main thread may."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in FORWARDED:
        current = signal.getsignal(signum)
        if signum in _previous or current is signal.SIG_IGN or current is _forward:
            continue
        _previous[signum] = current
        signal.signal(signum, _forward)


def _forward(signum: int, frame: Any) -> None:
    with _live_lock:
        jobs = list(_live)
    for job in jobs:
        job._request_stop(signum)
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_DFL:
        # Die of the signal once the jobs have ended, but not inside this handler: the
        # interrupted main thread may hold a job's lock, which the supervisors need to record
        # the end. A second signal meanwhile takes the default action at once.
        signal.signal(signum, signal.SIG_DFL)
        # Not a daemon: the process must not exit normally before the signal is re-raised.
        threading.Thread(target=_die_after, args=(jobs, signum), daemon=False).start()


def _die_after(jobs: list, signum: int) -> None:
    for job in jobs:
        # The grace period, then SIGKILL, then a moment to reap.
        job._done.wait(job._record["config"]["grace_period"] + 5.0)
    os.kill(os.getpid(), signum)
