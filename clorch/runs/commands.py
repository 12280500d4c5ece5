"""The commands that re-run or resume a run, and its checkpoints, read from its files."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any

from clorch._commands import pasteable, recipe_files_again, trusted_in_config
from clorch.runs.records import Run
from clorch.status import Status

# What clorch-train adds to the command line it hands Hydra (clorch.cli.run_dir.launch_overrides): a
# re-run makes its own directory, so these are left out.
_ADDED = ("hydra.run.dir", "hydra.sweep.dir", "hydra.job_logging.handlers.file.delay")
_MULTIRUN_FLAGS = ("-m", "--multirun")
# Overrides a resumed run must not repeat (as clorch.engine.interrupts._REPLACED): it names the
# checkpoint directory and resumes from its latest checkpoint.
_REPLACED = ("hydra.run.dir", "checkpoint.resume", "checkpoint.dir")
# Step checkpoints' names (clorch.checkpoint.policy; that module imports torch).
_STEP_NAME = re.compile(r"step_(\d{8,})\.ckpt")


def _key(arg: str) -> str:
    return arg.partition("=")[0].lstrip("+~")


def train_args(run: Run) -> list[str] | None:
    """The clorch-train arguments that give this run's config again, or None when unknown.

    A sweep's trial: its own overrides (one combination): the arguments its own
    clorch-train process was given (a side-by-side trial), else Hydra's record.
    A single run: the arguments typed (env.json's argv, where recorded), else
    Hydra's record of its overrides, else env.json's command line minus what
    clorch-train added.
    """
    typed = run.env.get("argv")
    if isinstance(typed, list) and all(isinstance(a, str) for a in typed) and (run.sweep is None or _own(typed, run)):
        args = typed[1:] if typed and Path(typed[0]).name.startswith("clorch-train") else typed
        return [a for a in args if _key(a) not in _ADDED and a not in _MULTIRUN_FLAGS]
    if run.raw_overrides or (run.path / ".hydra" / "overrides.yaml").is_file():
        return list(run.raw_overrides)
    command = run.env.get("command")
    if isinstance(command, list) and command and Path(str(command[0])).name.startswith("clorch-train"):
        return [str(a) for a in command[1:] if _key(str(a)) not in _ADDED and a not in _MULTIRUN_FLAGS]
    return None


def _own(typed: list[str], run: Run) -> bool:
    """Whether `typed` started this sweep trial as a process of its own (a side-by-side trial's
    clorch-train, given its run directory): its recipe files are named by their paths there."""
    cwd = _cwd(run) or "."
    dirs = [a.partition("=")[2] for a in typed if _key(a) == "hydra.run.dir"]
    return any(Path(cwd, d.strip("'\"")).resolve() == run.path.resolve() for d in dirs)


def rerun_command(run: Run, cd: bool = True) -> str:
    """`cd CWD && [CLORCH_TRUSTED_MODULES=...] clorch-train ARGS` (a new run with the same config,
    its paths absolute: it works pasted anywhere), or why there is none.

    A re-run starts from scratch: of a run that resumed, the resume and its checkpoint
    directory are left out (the re-run keeps its checkpoints in its own run directory) and
    `checkpoint.resume=none` is added, in case a recipe sets it. `cd=False`: no `cd CWD`
    unless modules are trusted by the variable (for a console in the run's own directory).
    """
    args = train_args(run)
    if args is None:
        started = run.env.get("command")
        how = f" (it was started by: {shlex.join(map(str, started))})" if isinstance(started, list) else ""
        return f"not known: the run was not started by clorch-train{how}"
    if _resumes(run):
        args = [a for a in args if _key(a) not in _REPLACED] + ["checkpoint.resume=none"]
    return pasteable(recipe_files_again(args, _cwd(run)), _cwd(run), _trusted(run), cd=cd)


def _resumes(run: Run) -> bool:
    """Whether the run's config resumed a checkpoint (checkpoint.resume other than none)."""
    section = run.config.get("checkpoint") if isinstance(run.config.get("checkpoint"), dict) else {}
    return section.get("resume") not in (None, "none")


def _cwd(run: Run) -> str | None:
    cwd = run.env.get("cwd")
    return cwd if isinstance(cwd, str) and cwd else None


def _trusted(run: Run) -> str | None:
    """The CLORCH_TRUSTED_MODULES value the run was started with, from config.yaml's comment."""
    try:
        return trusted_in_config((run.path / "config.yaml").read_text())
    except (OSError, UnicodeDecodeError):
        return None


def checkpoint_dir(run: Run) -> Path:
    """checkpoint.dir from the run's config, else <run dir>/checkpoints."""
    section = run.config.get("checkpoint") if isinstance(run.config.get("checkpoint"), dict) else {}
    configured = section.get("dir")
    if not (isinstance(configured, str) and configured):
        return run.path / "checkpoints"
    path, cwd = Path(configured).expanduser(), run.env.get("cwd")
    # clorch-train records it absolute; a relative one was relative to where the run started.
    return path if path.is_absolute() or not isinstance(cwd, str) else Path(cwd) / path


def checkpoints(run: Run) -> list[dict[str, Any]]:
    """The checkpoint files of the run's checkpoint directory: name, step (None for others), MiB."""
    directory = checkpoint_dir(run)
    out = []
    try:
        entries = sorted(directory.iterdir()) if directory.is_dir() else []
    except OSError:
        entries = []
    for path in entries:
        if path.suffix != ".ckpt" or not path.is_file():
            continue
        match = _STEP_NAME.fullmatch(path.name)
        try:
            mib = path.stat().st_size / 2**20
        except OSError:
            mib = None
        out.append({"path": str(path), "step": int(match.group(1)) if match else None, "mib": mib})
    return out


def resume_command(run: Run) -> str:
    """The command that resumes the run from its latest step checkpoint, or why there is none."""
    if run.status == Status.SUCCEEDED:
        return "not needed: the run completed"
    section = run.config.get("checkpoint") if isinstance(run.config.get("checkpoint"), dict) else {}
    policy = section.get("policy")
    steps = [c["step"] for c in checkpoints(run) if c["step"] is not None]
    if policy != "periodic" or not steps:
        why = (
            f"checkpoint.policy is {policy}" if policy != "periodic" else f"no step checkpoint in {checkpoint_dir(run)}"
        )
        return f"none: {why}; re-run it to start over"
    args = train_args(run)
    if args is None:
        return f"the latest checkpoint is step {max(steps)}; the run was not started by clorch-train"
    kept = [a for a in args if _key(a) not in _REPLACED]
    directory = os.path.abspath(checkpoint_dir(run))
    # It goes on in the same run directory, from its latest checkpoint, with the paths made
    # absolute and the trust variable the run had: it works pasted anywhere.
    return pasteable(
        [
            *recipe_files_again(kept, _cwd(run)),
            f"hydra.run.dir={os.path.abspath(run.path)}",
            f"checkpoint.dir={directory}",
            "checkpoint.resume=latest",
        ],
        _cwd(run),
        _trusted(run),
    )
