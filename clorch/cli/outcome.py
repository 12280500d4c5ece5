"""What the runs of one `clorch-train` command came to, and the exit status that says it.

One command starts one run or a sweep's jobs inside Hydra, whose job function
returns nothing to its caller: each job records here how it ended (its
clorch.status.Status), and the command's exit status is read from here once
Hydra returns: each status's own exit code (Status.exit_code), combined.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clorch.status import Status


@dataclass
class Ended:
    """One run of the command, and how it ended."""

    run_dir: str
    status: Status


@dataclass
class Outcome:
    """How the runs of one command ended."""

    argv: list[str] = field(default_factory=list)  # the command line's arguments, for the resume hint
    runs: list[Ended] = field(default_factory=list)  # each run (a sweep's jobs) as it ended
    interrupted_by: int | None = None  # the first signal that interrupted a run
    is_sweep: bool = False
    as_rank: bool = False  # this process was one rank of an outside launcher's job
    hosted_agent: bool = False  # this process ran torch's elastic agent (launcher=torchrun)
    unended: str | None = None  # the run directory of a run that started and has not ended yet

    def start(self) -> None:
        """Forget earlier runs' endings (the command line and the mode are kept)."""
        self.runs.clear()
        self.interrupted_by = None
        self.unended = None

    def started(self, run_dir: str) -> None:
        self.unended = str(run_dir)

    def ended(self, status: Status, run_dir: str) -> None:
        self.runs.append(Ended(str(run_dir), status))
        self.unended = None

    def interrupted(self, signum: int) -> None:
        if self.interrupted_by is None:
            self.interrupted_by = signum

    @property
    def refused(self) -> bool:
        """Config errors stopped a run of this command."""
        return any(run.status is Status.CONFIG_ERROR for run in self.runs)

    def exit_status(self, sweep_statuses: list[Status] = ()) -> int:
        """The command's exit status, from its runs' statuses (and a sweep's jobs' statuses,
        which a job in another process, hydra/launcher=submitit_*, reports only through
        its summary.json: clorch.sweep.report.last_statuses):

        128 + the signal when one interrupted a run (as a shell reports it); else 1 when
        any failed (Status.failed: a failed preflight too); else 2 when config errors
        stopped some; else 0.
        """
        if self.interrupted_by is not None:
            return Status.INTERRUPTED.exit_code_after(self.interrupted_by)
        statuses = [run.status for run in self.runs] + [Status.of(s) for s in sweep_statuses]
        if statuses == [Status.PRUNED] and not self.is_sweep:  # one trial of a sweep, run alone
            return Status.PRUNED.exit_code
        if any(s.failed for s in statuses):
            return Status.FAILED.exit_code
        if Status.CONFIG_ERROR in statuses:
            return Status.CONFIG_ERROR.exit_code
        return Status.SUCCEEDED.exit_code


OUTCOME = Outcome()
"""The command's outcome (one command per process: the console script, or a test calling it)."""
