"""A finished run's recorded command, run again into a directory of verify's own.

The rerun is `python -m clorch.cli ARGS` (clorch-train, of the clorch that runs
`clorch-runs verify`), started in the directory the run was started from, with the
arguments it was given (`commands.train_args`: a sweep trial's own combination), its
paths absolute, and only where it writes changed:

    hydra.run.dir=<rerun dir>   checkpoint.dir=<rerun dir>/checkpoints   checkpoint.path=null
    checkpoint.resume=none      logger.trackers=[]   logger.tensorboard=false

so that it starts from scratch (a run that resumed is rerun whole: a resume on the
same world size is bit-exact), writes nothing beside the run, and logs to no tracker
of yours. None of these decides a bit of the weights. With a step to stop at, every
step checkpoint is kept (`checkpoint.keep_last`), and the rerun is stopped (SIGTERM,
which clorch-train turns into a clean end) once its checkpoint of that step is written.

Its environment is verify's own: CLORCH_TRUSTED_MODULES is never taken from the run
directory (a run directory is data; what it may import is your decision).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from clorch._checkpoint_names import step_checkpoint_path
from clorch._commands import TRUST_VARIABLE, absolute_args, recipe_files_again, trusted_in_config
from clorch.runs.commands import train_args
from clorch.runs.discover import UsageError
from clorch.runs.records import Run

# The keys the rerun sets itself: where it writes, that it starts from scratch, no trackers.
_OWN_KEYS = (
    "hydra.run.dir",
    "checkpoint.dir",
    "checkpoint.path",
    "checkpoint.resume",
    "checkpoint.keep_last",
    "logger.trackers",
    "logger.tensorboard",
)
_KEEP_ALL = 1_000_000  # checkpoint.keep_last while a step's checkpoint is awaited: none is pruned
_POLL_S = 0.2
_STOP_GRACE_S = 120  # for clorch-train to stop its ranks and record the end after SIGTERM


def _key(arg: str) -> str:
    return arg.partition("=")[0].lstrip("+~")


def rerun_args(run: Run, directory: Path, keep_all: bool = False) -> list[str]:
    """clorch-train's arguments for the rerun of `run` into `directory` (see the module's docstring).

    Raises:
        UsageError: the run was not started by clorch-train (nothing records its arguments).
    """
    args = train_args(run)
    if args is None:
        started = run.env.get("command")
        how = f" (it was started by: {' '.join(map(str, started))})" if isinstance(started, list) else ""
        raise UsageError(f"RUN {run.id}: no recorded clorch-train command to rerun{how}")
    cwd = started_in(run)
    args = recipe_files_again([a for a in args if _key(a) not in _OWN_KEYS], cwd)
    args = absolute_args(args, cwd) if cwd else args
    section = run.config.get("checkpoint") if isinstance(run.config.get("checkpoint"), dict) else {}
    # A run without checkpoints gets no checkpoint keys: the checks refuse keys that do nothing.
    where = [f"checkpoint.dir={directory / 'checkpoints'}", "checkpoint.path=null"]
    own = [
        f"hydra.run.dir={directory}",
        *(where if section.get("policy", "none") != "none" else []),
        "checkpoint.resume=none",
        "logger.trackers=[]",
        "logger.tensorboard=false",
    ]
    return [*args, *own, *([f"checkpoint.keep_last={_KEEP_ALL}"] if keep_all else [])]


def started_in(run: Run) -> str | None:
    cwd = run.env.get("cwd")
    return cwd if isinstance(cwd, str) and cwd else None


def check_trust(run: Run) -> None:
    """Raise UsageError when the run trusted modules (CLORCH_TRUSTED_MODULES) that this
    environment does not: the rerun would import them only if you trust them yourself."""
    try:
        recorded = trusted_in_config((run.path / "config.yaml").read_text()) or ""
    except (OSError, UnicodeDecodeError):
        recorded = ""
    now = {m.strip() for m in os.environ.get(TRUST_VARIABLE, "").split(",") if m.strip()}
    missing = [m for m in recorded.split(",") if m and m not in now]
    if missing:
        raise UsageError(
            f"RUN {run.id} imported modules trusted by {TRUST_VARIABLE}={recorded}; the rerun imports "
            f"them only if you trust them: set {TRUST_VARIABLE} yourself (it is never read from the "
            f"run directory; not trusted now: {', '.join(missing)})"
        )


@dataclass
class RerunEnd:
    """How the rerun ended: its exit status, whether verify stopped it, its output's file."""

    returncode: int
    stopped: bool
    log: Path

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def start_rerun(run: Run, directory: Path, args: list[str]) -> subprocess.Popen:
    """Start `clorch-train ARGS` where the run was started, its output in `directory`.log."""
    cwd = started_in(run)
    if cwd is not None and not Path(cwd).is_dir():
        raise UsageError(f"RUN {run.id} was started in {cwd}, which no longer exists: its command cannot be rerun")
    log = directory.with_suffix(".log")
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "clorch.cli", *args], cwd=cwd, stdout=out, stderr=subprocess.STDOUT
        )


def await_rerun(proc: subprocess.Popen, directory: Path, step: int | None) -> RerunEnd:
    """Wait for the rerun to end, or, with `step`, for its checkpoint of that step, then stop it.

    A Ctrl-C here reaches the rerun too (one process group): it is stopped, then re-raised.
    """
    log, stopped = directory.with_suffix(".log"), False
    wanted = step_checkpoint_path(directory / "checkpoints", step) if step is not None else None
    try:
        while proc.poll() is None:
            # The checkpoint's name appears last, by an atomic rename: once there, it is whole.
            if wanted is not None and wanted.is_file():
                stopped = True
                _stop(proc)
                break
            time.sleep(_POLL_S)
    except BaseException:
        _stop(proc)
        raise
    return RerunEnd(proc.returncode, stopped, log)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM (clorch-train stops its ranks and records the end), then SIGKILL after a grace."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(_STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
