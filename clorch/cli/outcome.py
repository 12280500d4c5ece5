"""What the runs of one `clorch-train` command came to, and the exit status that says it.

One command starts one run or a sweep's jobs inside Hydra, whose job function
returns nothing to its caller: each job records here how it ended, and the
command's exit status is read from here once Hydra returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

EXIT_OK, EXIT_FAILED = 0, 1


@dataclass
class Outcome:
    """How the runs of one command ended."""

    argv: list[str] = field(default_factory=list)  # the command line's arguments, for the resume hint
    failed: list[str] = field(default_factory=list)  # run directories of jobs that failed or were stopped
    refused: list[str] = field(default_factory=list)  # run directories of jobs that config errors stopped
    interrupted_by: int | None = None  # the first signal that interrupted a run
    is_sweep: bool = False
    as_rank: bool = False  # this process was one rank of an outside launcher's job

    def start(self) -> None:
        """Forget earlier runs' endings (the command line and the mode are kept)."""
        self.failed.clear()
        self.refused.clear()
        self.interrupted_by = None

    def interrupted(self, signum: int) -> None:
        if self.interrupted_by is None:
            self.interrupted_by = signum

    def exit_status(self, sweep_statuses: list[str], config_status: int) -> int:
        """0 when every job succeeded; `config_status` (2) when config errors alone stopped some;
        128 + the signal when one interrupted the run (as a shell reports it); else 1.

        Args:
            sweep_statuses: the statuses of a sweep's jobs (clorch.engine.sweep.last_statuses).
            config_status: the exit status of a config error.
        """
        if self.interrupted_by is not None:
            return 128 + self.interrupted_by
        failed = bool(self.failed) or any(s not in ("succeeded", "config_error") for s in sweep_statuses)
        config = bool(self.refused) or "config_error" in sweep_statuses
        if config and not failed:
            return config_status
        return EXIT_FAILED if failed or config else EXIT_OK


OUTCOME = Outcome()
"""The command's outcome (one command per process: the console script, or a test calling it)."""
