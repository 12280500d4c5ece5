"""Every status a run or a sweep's job can have: its word, its exit code, its console line.

The word is what summary.json, sweep_summary.csv and `clorch-runs` say; the exit
code is what `clorch-train` exits with on every node and in every entry mode (a
single run, a sweep's job, `clorch.run_local`'s caller reading it, `launcher=torchrun`,
and torchrun, srun or submitit running `clorch-train` itself); the console line is
how a node's console starts to say it. Nothing else in clorch spells these out.

    status            exit  console line
    succeeded         0     clorch-train: succeeded
    pruned            3     clorch-train: pruned at step S by the sweep's pruner (a sweep's trial)
    paused            0     clorch-train: paused at step S by the sweep's ASHA pruner (a sweep's trial;
                            its checkpoint at S lets the sweep promote it: clorch.sweep.asha)
    failed            1     clorch-train: job failed
    preflight_failed  1     clorch-train: preflight failed, nothing was trained
    interrupted       130   clorch-train: interrupted  (128 + the signal: 143 for SIGTERM)
    stopped           1     clorch-train: job stopped
    timed_out         1     clorch-train: job timed_out
    config_error      2     clorch-train: config error(s); nothing was launched
    not_started ... unknown: a sweep's job or a listed run that never ended here (exit 1)

`preflight=only` that passes is "succeeded" (nothing was to be trained); a failed
preflight is never "succeeded", whatever the launcher's own state says.
Imports nothing but the standard library: the command line starts without torch.
"""

from __future__ import annotations

import signal
from enum import Enum

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_PRUNED = 0, 1, 2, 3


class Status(str, Enum):
    """A run's status. A `str`: it equals its word and is written as its word in JSON and CSV."""

    SUCCEEDED = "succeeded"
    PRUNED = "pruned"  # a sweep's trial that its pruner stopped at an eval (clorch.sweep)
    PAUSED = "paused"  # a sweep's trial that ASHA stopped at a rung, with a checkpoint to continue from
    FAILED = "failed"
    PREFLIGHT_FAILED = "preflight_failed"
    INTERRUPTED = "interrupted"
    STOPPED = "stopped"  # the launcher stopped the job (a stop request, SIGTERM to it)
    TIMED_OUT = "timed_out"  # the launcher's launcher.timeout ran out
    CONFIG_ERROR = "config_error"
    NOT_STARTED = "not_started"  # a sweep's job an interrupted sweep did not reach
    MISSING = "missing"  # a sweep's job directory without summary.json
    RUNNING = "running"  # told from files by clorch-runs: the launcher lives
    KILLED = "killed"  # told from files: the launcher died without recording the end
    UNKNOWN = "unknown"  # told from files: nothing says

    def __str__(self) -> str:  # f"{status}" is the word, as in the files
        return self.value

    @classmethod
    def of(cls, word: object) -> "Status":
        """The status a file or the launcher names; UNKNOWN for a word clorch does not know."""
        try:
            return cls(word)
        except ValueError:
            return cls.UNKNOWN

    @property
    def exit_code(self) -> int:
        """What `clorch-train` exits with for this status (an interruption: 128 + SIGINT;
        `exit_code_after` gives 128 + the signal that really came)."""
        return _EXIT.get(self, EXIT_FAILED)

    def exit_code_after(self, signum: int | None) -> int:
        """The exit code, with the signal that interrupted the run (as a shell reports it)."""
        if self is Status.INTERRUPTED and signum is not None:
            return 128 + int(signum)
        return self.exit_code

    @property
    def ok(self) -> bool:
        return self is Status.SUCCEEDED

    @property
    def failed(self) -> bool:
        """Counts as a failure (in a sweep's exit code and in `clorch-runs ls --status failed`):
        anything that ended without succeeding, a config error, a pruned or paused trial and a live
        run aside."""
        return self not in (Status.SUCCEEDED, Status.PRUNED, Status.PAUSED, Status.CONFIG_ERROR, Status.RUNNING)

    @property
    def phrase(self) -> str:
        """The words after `clorch-train: ` on the console."""
        return _PHRASE.get(self, f"job {self.value}")

    def line(self, detail: str = "") -> str:
        """The console line: `clorch-train: <phrase><detail>` (detail starts with its own
        punctuation: ", 40 steps; outputs in DIR")."""
        return f"clorch-train: {self.phrase}{detail}"


_EXIT = {
    Status.SUCCEEDED: EXIT_OK,
    Status.PRUNED: EXIT_PRUNED,
    Status.PAUSED: EXIT_OK,  # not an end: a paused trial may be promoted and continue
    Status.CONFIG_ERROR: EXIT_CONFIG,
    Status.INTERRUPTED: 128 + int(signal.SIGINT),
}
_PHRASE = {
    Status.SUCCEEDED: "succeeded",
    Status.PRUNED: "pruned",
    Status.PAUSED: "paused",
    Status.PREFLIGHT_FAILED: "preflight failed, nothing was trained",
    Status.INTERRUPTED: "interrupted",
    Status.CONFIG_ERROR: "config error(s); nothing was launched",
}
