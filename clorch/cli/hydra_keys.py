"""Which of Hydra's own keys `clorch-train` accepts on its command line, and where outputs may go.

A config is data: it must not run code or write outside its run. Hydra's
callbacks (`hydra.callbacks.*._target_`), its logging configs (handlers with
arbitrary files, formatters with `()` factories) and its launcher's `_target_`
would import and call whatever they name, before clorch sees the config. So
only the keys below are accepted (recipes may set none: see
clorch.config.composer), and the run and sweep directories must be new, empty,
or an earlier clorch run's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from clorch._files import unwritable
from clorch.cli.hydra_flags import MULTIRUN
from clorch.sweep.settings import SAMPLERS
from clorch.sweep.directory import IDENTITY_FILE, IDENTITY_FILE_TMP, LOCK_FILE, SWEEP_END_FILES
from clorch.engine.rank_end import MARKER as JOB_ENDED

# Keys (and everything below them) a user may set.
ALLOWED_KEYS = (
    "hydra.run.dir",
    "hydra.sweep.dir",
    "hydra.sweep.subdir",
    "hydra.job.chdir",
    "hydra.job.name",
    "hydra.verbose",
    "hydra.sweeper",  # the sweepers' keys (clorch.sweep.settings), checked before the sweep
)
# The submitit launchers' resource keys; not `setup`, `srun_args`, `additional_parameters` or
# `submitit_folder`, which put shell lines into the job script or write anywhere.
LAUNCHER_KEYS = (
    "timeout_min",
    "cpus_per_task",
    "gpus_per_node",
    "tasks_per_node",
    "mem_gb",
    "nodes",
    "name",
    "stderr_to_stdout",
    "partition",
    "qos",
    "comment",
    "constraint",
    "exclude",
    "gres",
    "cpus_per_gpu",
    "gpus_per_task",
    "mem_per_gpu",
    "mem_per_cpu",
    "account",
    "signal_delay_s",
    "max_num_timeout",
    "array_parallelism",
)
# Group choices a user may make: Hydra's built-in logging configs and the launchers clorch supports.
ALLOWED_CHOICES = {
    "hydra/launcher": ("basic", "submitit_local", "submitit_slurm"),
    "hydra/sweeper": ("basic", "grid", "optuna"),  # clorch's own sweepers (clorch.sweep)
    "hydra/sweeper/sampler": SAMPLERS,
    "hydra/job_logging": ("default", "disabled", "none", "stdout"),
    "hydra/hydra_logging": ("default", "disabled", "none"),
}
# What clorch (and Hydra, for clorch) writes into a run or sweep directory.
RUN_FILES = {
    ".hydra",
    "config.yaml",
    "env.json",
    "logs",
    "metrics.jsonl",
    "events.jsonl",
    "summary.json",
    "checkpoints",
    "loss.png",
    "clorch-train.log",
    "tensorboard",
    ".submitit",
    "multirun.yaml",
    "sweep_summary.csv",
    "sweep_summary.md",
    "preflight.json",
    "console.log",  # a side-by-side trial's console (clorch.sweep.pool)
    JOB_ENDED,  # the end a rank recorded (an outside launcher's job, a one-rank trial: clorch.engine.rank_end)
    "optuna.db",  # the sweep's Optuna study (clorch.sweep.study)
    "sweep_history.png",
    "sweep_params.png",
    LOCK_FILE,  # the sweep's lock and identity (clorch.sweep.directory)
    IDENTITY_FILE,
    IDENTITY_FILE_TMP,
    *SWEEP_END_FILES,  # best.yaml, sweep_pareto.png (clorch.sweep.directory)
}


def _parts(arg: str) -> tuple[str, str, bool]:
    """(key, value, is_group_choice) of a command-line override."""
    key, _, value = arg.partition("=")
    key = key.lstrip("+~")
    return key, value, "/" in key


def _is_hydra(key: str) -> bool:
    return key == "hydra" or key.startswith(("hydra.", "hydra/"))


def _package(key: str) -> str:
    """Where `group@package=...` places a group ("" without `@`)."""
    return key.partition("@")[2].removeprefix("_global_.")


def touches_hydra(arg: str) -> bool:
    """Whether a command-line override sets one of Hydra's keys or places a group under hydra."""
    key = _parts(arg)[0]
    return _is_hydra(key) or _is_hydra(_package(key))


def _key_error(key: str, value: str, group: bool) -> str | None:
    if group:
        allowed = ALLOWED_CHOICES.get(key)
        if allowed is None:
            return (
                f"{key}={value} is not allowed: clorch-train accepts these Hydra groups: {', '.join(ALLOWED_CHOICES)}"
            )
        if value not in allowed:
            return f"{key}={value} is not allowed; choose one of: {', '.join(allowed)}"
        return None
    if "_target_" in key.split(".") or key.endswith("._args_"):
        return f"{key} is not allowed: a config may not name code for Hydra to import"
    if key.startswith("hydra.launcher."):
        if key.split(".", 2)[2] in LAUNCHER_KEYS:
            return None
        return f"{key} is not allowed; hydra.launcher takes: {', '.join(LAUNCHER_KEYS)}"
    if key == "hydra.mode":
        return "hydra.mode is not allowed: start a sweep with -m (--multirun), a single run without it"
    if key == "hydra.job.name" and ("/" in value or value in (".", "..")):
        return f"hydra.job.name={value} is not allowed: a name, without '/'"
    if key == "hydra.sweep.subdir" and (value.startswith("/") or ".." in Path(value).parts):
        return f"hydra.sweep.subdir={value} is not allowed: a path inside the sweep directory"
    if not any(key == k or key.startswith(k + ".") for k in ALLOWED_KEYS):
        return (
            f"{key} is not allowed: Hydra's callbacks, logging and output settings can run code "
            f"or write outside the run; clorch-train accepts: {', '.join(ALLOWED_KEYS)} (and below), "
            "and hydra.launcher's resource keys"
        )
    return None


def _foreign(directory: Path) -> list[str]:
    """Entries of an existing directory that clorch did not write (numbered trial dirs are ours)."""
    return sorted(
        p.name
        for p in directory.iterdir()
        if p.name not in RUN_FILES
        and not p.name.isdigit()
        # (.clorch-probe-*: another launch checking, a moment ago, that it can write here;
        # .plan-*: the launch plan of a node running launcher=torchrun)
        and not p.name.startswith((".rank0_result", ".clorch-probe-", ".plan-"))
    )


def directory_error(key: str, value: str) -> str | None:
    """Why `value` cannot be the run (or sweep) directory, or None."""
    if not value:
        return None
    if "${" in value:
        if not all(part.startswith("now:") for part in value.split("${")[1:]):
            return f"{key}={value} is not allowed: the only interpolation a run directory may use is ${{now:...}}"
        # Dates, as Hydra's defaults use: new by construction; only where they go is checked.
        prefix = value.split("${")[0]  # the fixed part; it may end inside a name
        target = Path(prefix if prefix.endswith("/") else os.path.dirname(prefix) or ".").expanduser()
    else:
        target = Path(value).expanduser().resolve()
        if target == Path(target.anchor):
            return f"{key}={value} is the filesystem root; choose a directory for this run"
        if target.exists() and not target.is_dir():
            return f"{key}={value} is a file, not a directory"
        if target.is_dir():
            foreign = _foreign(target)
            if foreign:
                shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
                return f"{key}={value} holds files clorch did not write ({shown}); choose a new or empty directory"
    problem = unwritable(target)  # Hydra makes this directory before clorch's own checks run
    if problem:
        return f"{key}={value}: cannot write there ({problem}); choose a writable location"
    return None


def hydra_key_errors(args: Iterable[str]) -> list[str]:
    """Every refused Hydra key, group choice or output directory among the command-line `args`.

    Only the output directory this command will use is checked: `hydra.sweep.dir`
    with `-m`/`--multirun`, `hydra.run.dir` without.
    """
    args = list(args)
    used_dir = "hydra.sweep.dir" if any(arg in MULTIRUN for arg in args) else "hydra.run.dir"
    errors = []
    for arg in args:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, value, group = _parts(arg)
        if _is_hydra(_package(key)):  # `+recipe@hydra=x` would put a config's keys under hydra unchecked
            errors.append(f"{arg} is not allowed: a config group may not be placed under hydra")
            continue
        if not _is_hydra(key):
            continue  # clorch's own keys: checked against the schema (and its _target_ allow-list)
        error = _key_error(key, value, group)
        if error is None and key.startswith("hydra.sweeper.params.") and not arg.startswith("+"):
            # The sweepers' composed params is null: Hydra refuses a new key under it without '+'.
            error = f"{arg} needs a '+': write '+{key}=\"{value}\"' (quoted for Hydra, inside the shell's quotes)"
        if error is None and key == used_dir:
            error = directory_error(key, value)
        if error is not None:
            errors.append(error)
    return errors
