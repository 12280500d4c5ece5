"""How the ranks of an outside launcher's job (torchrun, srun, submitit running `clorch-train`
itself) record an end that rank 0 did not reach: a rank that failed, or a signal.

No launching process of clorch's watches such a job, and a failing rank makes the launcher
end the others (SIGTERM), so summary.json is written by the ranks themselves:

* A rank whose training raised writes it at once: status failed, this rank as the one that
  failed first, its error and traceback; the console line is the one clorch's own launcher
  prints (`clorch-train: job failed: rank R failed first: ...`).
* A rank whose collective failed because a peer went away (its connection closed) waits
  `PEER_GRACE_S` first, so that the rank that really failed, which leaves the group before
  it records its end, is the one named.
* A rank that a signal stops (the launcher's SIGTERM when it was itself signalled or
  cancelled, Ctrl-C) writes status interrupted, with the signal.

The first end recorded in the job wins (`claim`: a marker file created exclusively in the
run directory, which every node shares); rank 0 removes an earlier start's marker when it
starts (`clear`), so that a restart by the launcher records its own end.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from clorch.engine.interrupts import HANDLED
from clorch.engine.results import JobEnd, RunSummary, last_step
from clorch.engine.summary import show, summarize, summary_lines, write_summary
from clorch.env import restart_count
from clorch.status import Status

MARKER = ".job-ended"
PEER_GRACE_S = 3.0
# What gloo and the TCP store say in a rank whose peer's process ended.
_PEER_GONE = ("closed by peer", "reset by peer", "broken pipe", "connection refused")


def clear(run_dir: Path) -> None:
    """Rank 0, starting: forget the end an earlier start of the job recorded."""
    (run_dir / MARKER).unlink(missing_ok=True)


def claim(run_dir: Path) -> bool:
    """Whether this rank records the job's end: the first to ask, in the whole job."""
    try:
        os.close(os.open(run_dir / MARKER, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False
    except OSError:  # the run directory is gone or read-only: write_summary says so
        return True


def peer_gone(exc: BaseException) -> bool:
    """Whether `exc` says another rank's process went away (not this rank's own failure)."""
    text = str(exc).lower()
    return any(words in text for words in _PEER_GONE)


def failed(plan: Any, run_dir: Path, rank: Any, start: float, exc: Exception) -> None:
    """Record (if first) and show the job's failure as this rank saw it; signals are ignored meanwhile."""
    for signum in HANDLED:  # the launcher's SIGTERM to the others must not cut the record short
        signal.signal(signum, signal.SIG_IGN)
    error = {
        "rank": rank.env.rank,
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }
    failed_rank: int | None = rank.env.rank
    if peer_gone(exc):
        time.sleep(PEER_GRACE_S)  # the rank that failed first records it meanwhile
        failed_rank, error["rank"] = None, None
        error["message"] = f"another rank ended first ({exc})"
    if not claim(run_dir):
        return
    state = {"state": Status.FAILED, "failed_rank": failed_rank, "error": error}
    summary = _summary(plan, run_dir, rank, start, state)
    write_summary(run_dir, summary, plot=False)
    show(summary_lines(summary, str(run_dir))[:1])  # its traceback was printed above


def interrupted(plan: Any, run_dir: Path, rank: Any, start: float, signal_name: str) -> None:
    """Record (if first) and show that a signal ended the job."""
    if not claim(run_dir):
        return
    state = {"state": Status.INTERRUPTED, "interrupted_by": signal_name}
    summary = _summary(plan, run_dir, rank, start, state)
    write_summary(run_dir, summary, plot=False)
    detail = f" by {signal_name} after step {last_step(summary)} of {summary.planned_steps}; outputs in {run_dir}"
    print(Status.INTERRUPTED.line(detail), file=sys.stderr, flush=True)


def _summary(plan: Any, run_dir: Path, rank: Any, start: float, state: dict[str, Any]) -> RunSummary:
    end = JobEnd.from_launcher({**state, "attempts": [None] * (restart_count() + 1)})
    summary = summarize(end, run_dir, plan, time.perf_counter() - start)
    summary.launcher = rank.launcher
    return summary
