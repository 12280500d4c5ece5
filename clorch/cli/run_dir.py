"""The run directory of a `clorch-train` launch: made before Hydra starts, taken back on a config error.

Hydra names the directory after the current second and reuses it when it
exists, so runs started in the same second would write into one directory.
Unless the user chose one (hydra.run.dir, or hydra.sweep.dir for -m), the
directory is created here, atomically, and handed to Hydra. A single run that
its config errors stop leaves nothing behind.
"""

from __future__ import annotations

import datetime as _dt
import sys
from pathlib import Path

from clorch.config.composer import format_value
from clorch.engine.footprint import Footprint
from clorch.engine.outputs import new_run_dir


def sets(args: list[str], *keys: str) -> bool:
    """Whether an override in `args` sets one of `keys` or a key below it (`+`/`++`/`~` too)."""
    names = [a.split("=")[0].lstrip("+~") for a in args if not a.startswith("-")]
    return any(n == k or n.startswith((f"{k}.", f"{k}/")) for n in names for k in keys)


def value_of(args: list[str], key: str) -> str | None:
    """The value the last override of `key` in `args` sets (quotes removed), or None."""
    values = [a.partition("=")[2] for a in args if a.partition("=")[0].lstrip("+") == key]
    return values[-1].strip("'\"") if values else None


def launch_overrides(args: list[str], multirun: bool) -> tuple[list[str], Path | None, Footprint | None]:
    """Hydra overrides that give this launch its own directory and no empty log file.

    Returns:
        (the overrides, the directory created here or None, the launch's Footprint or None
        when the directory is not known before Hydra resolves it).

    Raises:
        OSError: outputs/ (or multirun/) cannot be made in the current directory.
    """
    out, created = [], None
    key, layout = ("hydra.sweep.dir", "multirun") if multirun else ("hydra.run.dir", "outputs")
    if not sets(args, key):
        footprint = Footprint(Path(layout) / _dt.date.today().isoformat() / "new")  # the parents made
        created = new_run_dir(layout=layout)
        footprint.made(created)
        out.append(f"{key}={format_value(str(created))}")
    else:
        value = value_of(args, key)
        footprint = Footprint(value) if value and "${" not in value else None
    if not sets(args, "hydra/job_logging", "hydra.job_logging"):
        # The launching process rarely logs: open clorch-train.log on the first record only.
        out.append("++hydra.job_logging.handlers.file.delay=true")
    return out, created, footprint


def remove_if_empty(directory: Path | None) -> None:
    """Drop a directory made for a launch that Hydra never started (it is still empty)."""
    if directory is None:
        return
    try:
        directory.rmdir()  # fails, as wanted, once the run wrote anything
    except OSError:
        pass


def hold(footprint: Footprint | None) -> None:
    """Mark the run directory as in use by this launch before Hydra writes there, so that
    a launch refused meanwhile (another node, another run) leaves this one's files alone."""
    if footprint is None:
        return
    try:
        footprint.hold()
    except OSError:
        pass  # Hydra cannot write there either, and says why; without the mark undo removes nothing


def remove_refused(footprint: Footprint | None, refused: bool) -> None:
    """Take back what a single run that its config errors stopped (`refused`) left on disk.

    Only what Hydra wrote (.hydra/, perhaps clorch-train.log) and the directories
    made for it: no run happened. Nothing, while another process uses the directory
    (another node of a job sharing it, or another run): those files may be its own.
    """
    if footprint is None:
        return
    if refused and not footprint.undo():
        print(
            f"clorch-train: left {footprint.path} as it was: another process is using it (another "
            "node of the same job, or another run), and the files there may be its own",
            file=sys.stderr,
        )
    footprint.release()
