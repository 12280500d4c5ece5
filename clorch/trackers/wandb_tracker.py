"""The wandb tracker: a run's config, metrics and files in a Weights & Biases run (`logger.trackers=[wandb]`).

wandb.init(mode=...): "offline" writes RUN_DIR/wandb/offline-run-*/ (upload later with
`wandb sync RUN_DIR/wandb/offline-run-*`), "online" needs a login, "auto" is online when an
API key is found (`resolve_wandb_mode`). The project: `logger.experiment`, else WANDB_PROJECT,
else "clorch"; WANDB_DIR moves wandb/ out of the run directory; WANDB_ENTITY is W&B's own
(`wandb_target`). The package is the `wandb` extra, imported when the tracker starts.

Sweeps: the trials of `clorch-train -m` are one W&B group, named after the sweep directory
(WANDB_RUN_GROUP, W&B's own variable, which a user's setting overrides).
"""

from __future__ import annotations

import netrc
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import urlparse

from clorch.trackers.base import (
    DEFAULT_EXPERIMENT,
    SUCCEEDED,
    BaseTracker,
    Extra,
    record_metrics,
    register,
    run_name,
)

WANDB_MODES = ("auto", "online", "offline", "disabled")


def wandb_target(project: str | None, run_dir: Path) -> tuple[str, Path]:
    """W&B's project and directory for a run, by W&B's own conventions.

    The project: `project` (logger.experiment); when null, WANDB_PROJECT when set;
    else "clorch". The directory W&B writes its wandb/ folder in: WANDB_DIR when
    set, else the run directory. WANDB_ENTITY (the team or user) is W&B's own to read.
    """
    return (
        project or os.environ.get("WANDB_PROJECT") or DEFAULT_EXPERIMENT,
        Path(os.environ.get("WANDB_DIR") or run_dir),
    )


def resolve_wandb_mode(mode: str) -> str:
    """ "auto": "online" when an API key is set (WANDB_API_KEY, or ~/.netrc / $NETRC for the
    W&B host, api.wandb.ai unless WANDB_BASE_URL names another), else "offline"; other modes
    are returned as they are. Raises ValueError for a mode not in WANDB_MODES."""
    if mode not in WANDB_MODES:
        raise ValueError(f"wandb mode must be one of {', '.join(WANDB_MODES)}, got {mode!r}")
    if mode != "auto":
        return mode
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    path = Path(os.environ.get("NETRC") or Path("~/.netrc").expanduser())
    try:
        found = path.is_file() and netrc.netrc(str(path)).authenticators(host or "") is not None
    except (OSError, netrc.NetrcParseError):
        found = False
    return "online" if found else "offline"


@register
class WandbTracker(BaseTracker):
    """A W&B run of its own (reinit="create_new"). Rank 0 only; never raises (see BaseTracker).

    The run's console is not captured (clorch keeps logs/), git and code are not
    saved (env.json records the commit), and W&B prints nothing (WANDB_SILENT):
    each only where the user has not set the variable. Offline, nothing goes to
    the network (error reports are off too); system metrics are still sampled.
    The artifacts go into the run's files as clorch/NAME: W&B writes its own
    files/config.yaml when a run syncs, which a config.yaml of ours would collide with.
    """

    name = "wandb"
    extra = Extra("wandb", "wandb")
    folders = ("wandb",)  # W&B's run folders (offline or not) hold copies of the run's files
    logger_keys = ("experiment", "mode")

    def __init__(self, project: str, run_name: str, run_dir: Path, mode: str, directory: Path | None = None):
        super().__init__()
        self.project, self.run_name, self.run_dir, self.mode = project, run_name, Path(run_dir), mode
        self.directory = Path(directory or run_dir)  # where W&B writes its wandb/ folder
        self.run: Any = None

    @classmethod
    def from_settings(cls, run_dir: Path, run_name: str, settings: Mapping[str, Any]) -> WandbTracker:
        """The run's tracker: the logger's `experiment` as the project and its `mode` resolved
        (`wandb_target`, `resolve_wandb_mode`). Raises ValueError for a mode not in WANDB_MODES."""
        project, directory = wandb_target(settings["experiment"], run_dir)
        return cls(project, run_name, run_dir, resolve_wandb_mode(settings["mode"]), directory)

    @classmethod
    def sweep_environ(
        cls, sweep_dir: Path, settings: Mapping[str, Any]
    ) -> tuple[dict[str, str], Callable[[str], None]]:
        """The trials' environment that groups their runs by sweep: WANDB_RUN_GROUP, the sweep
        directory's name (as `run_name` gives it), unless the user has set one. Nothing to close."""
        if os.environ.get("WANDB_RUN_GROUP"):
            return {}, lambda status: None
        return {"WANDB_RUN_GROUP": run_name(sweep_dir)}, lambda status: None

    def _env(self) -> Mapping[str, str]:
        env = {
            "WANDB_SILENT": "true",
            "WANDB_CONSOLE": "off",
            "WANDB_DISABLE_GIT": "true",
            "WANDB_DISABLE_CODE": "true",
        }
        if self.mode != "online":
            env["WANDB_ERROR_REPORTING"] = "false"
        return env

    def _start(self, params: dict[str, Any]) -> None:
        import wandb  # lazy: wandb is optional and slow to import (about 1.5 s)

        self.run = wandb.init(
            project=self.project,
            name=self.run_name,
            dir=str(self.directory),
            config=params,
            mode=self.mode,
            reinit="create_new",
        )

    def _log(self, record: dict[str, Any]) -> None:
        step, numbers = record_metrics(record)
        if numbers:
            self.run.log(numbers, step=step)

    def _finish(self, status: str, artifacts: list[Path]) -> None:
        try:
            if self.mode != "disabled":
                files = Path(self.run.dir)
                (files / "clorch").mkdir(exist_ok=True)
                for path in artifacts:
                    # A copy, not W&B's symlink: the run's files stay as they were at its end.
                    copy = shutil.copy2(path, files / "clorch" / path.name)
                    self.run.save(str(copy), base_path=str(files), policy="now")
        finally:
            self.run.finish(exit_code=0 if status in SUCCEEDED else 1)
