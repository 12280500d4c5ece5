"""Every status owns its exit code and its console line (clorch.status.Status), and the
records that carry it read and write the files they always did."""

from __future__ import annotations

import signal

import pytest

from clorch.cli.outcome import Outcome
from clorch.config.checks import EXIT_STATUS
from clorch.engine.results import JobEnd, PreflightVerdict, RunSummary
from clorch.engine.summary import preflight_lines, summary_lines
from clorch.sweep.summary import SweepRow
from clorch.runs.records import STATUSES
from clorch.status import Status

pytestmark = pytest.mark.timeout(60)

# The exit codes clorch-train documents (docs/training.md, "Exit codes"), by status.
DOCUMENTED = {
    "succeeded": 0,
    "pruned": 3,
    "paused": 0,
    "failed": 1,
    "preflight_failed": 1,
    "interrupted": 130,
    "stopped": 1,
    "timed_out": 1,
    "config_error": 2,
    "not_started": 1,
    "missing": 1,
    "running": 1,
    "killed": 1,
    "unknown": 1,
}


@pytest.mark.parametrize("status", list(Status), ids=str)
def test_each_status_derives_its_exit_code_and_its_console_line(status):
    assert status.exit_code == DOCUMENTED[status.value]
    assert status == status.value and f"{status}" == status.value and Status.of(status.value) is status
    line = status.line("; outputs in /x")
    assert line == f"clorch-train: {status.phrase}; outputs in /x"
    assert ("succeeded" in line) == (status is Status.SUCCEEDED)  # nothing else ever says it
    # A command whose one run ended so exits with that status's code.
    outcome = Outcome()
    outcome.ended(status, "/x")
    if status is Status.INTERRUPTED:
        outcome.interrupted(signal.SIGTERM)
        assert outcome.exit_status() == status.exit_code_after(signal.SIGTERM) == 143
    else:
        assert outcome.exit_status() == (status.exit_code if status is not Status.RUNNING else 0)
    # ... and a sweep whose job (in another process) recorded it, beside a job that succeeded.
    # A pruned trial is a sweep's trial that ended as its sweep wanted: the sweep exits 0.
    if status in (Status.PRUNED, Status.PAUSED):
        assert Outcome().exit_status([Status.SUCCEEDED, status.value]) == 0
    elif status not in (Status.INTERRUPTED, Status.RUNNING):
        assert Outcome().exit_status([Status.SUCCEEDED, status.value]) == status.exit_code


def test_the_config_errors_status_is_the_config_checks_exit_code_and_every_word_is_listable():
    assert Status.CONFIG_ERROR.exit_code == EXIT_STATUS == 2
    assert Status.of("no such word") is Status.UNKNOWN
    assert {"preflight_failed", "succeeded", "failed", "killed"} <= set(STATUSES)
    assert Status.PREFLIGHT_FAILED.failed and not Status.SUCCEEDED.failed and not Status.CONFIG_ERROR.failed


def test_a_failed_preflight_is_never_succeeded_on_the_console_or_in_the_summary(tmp_path):
    verdict = PreflightVerdict(
        passed=False, failures=["rank 1 (on host h2) did not arrive within 0.001 s"], table="TABLE"
    )
    end = JobEnd.from_launcher(
        {"state": "succeeded", "results": [{"steps": 0, "preflight": verdict.to_dict()}], "attempts": [{}]}
    )
    assert end.state is Status.SUCCEEDED and end.rank0.preflight == verdict
    summary = RunSummary(status=Status.PREFLIGHT_FAILED, steps=0, preflight=verdict, world_size=2)
    lines = summary_lines(summary, str(tmp_path))
    assert (
        lines
        == preflight_lines(verdict, 2, str(tmp_path))
        == [
            ("TABLE", False),
            (Status.PREFLIGHT_FAILED.line(f"; preflight.json in {tmp_path}"), True),
            ("  - rank 1 (on host h2) did not arrive within 0.001 s", True),
        ]
    )
    assert not any("succeeded" in text for text, _ in lines)


def test_summary_json_keeps_its_keys_and_older_files_read_back():
    old = {
        "status": "succeeded",
        "exit_codes": [0, 0],
        "failed_rank": None,
        "error": None,
        "steps": 4,
        "planned_steps": 4,
        "final": {"loss": 0.5, "step": 4},
        "best": {},
        "wall_time_s": 1.0,
        "train_time_s": 0.5,
        "samples_per_s": 10.0,
        "tokens_per_s": None,
        "weights_sha256": "ab",
        "resumed_from": None,
        "world_size": 2,
        "backend": "gloo",
        "attempts": 1,
        "trusted_modules": {},
        "exported": None,
    }
    summary = RunSummary.from_dict(old)
    assert summary.status is Status.SUCCEEDED and summary.final["loss"] == 0.5
    assert summary.to_dict() == old  # the same keys: nothing optional was set
    interrupted = RunSummary.from_dict(
        {**old, "status": "interrupted", "interrupted_by": "SIGINT", "launcher": "torchrun"}
    )
    assert interrupted.to_dict()["interrupted_by"] == "SIGINT" and interrupted.launcher == "torchrun"
    refused = RunSummary.config_error(["batch_size must be >= 1"])
    assert refused.to_dict() == {"status": "config_error", "errors": ["batch_size must be >= 1"]}
    assert RunSummary.from_dict({"status": "from a later clorch"}).status is Status.UNKNOWN
    row = SweepRow.of("3", {"seed": "1"}, RunSummary.from_dict({"status": "preflight_failed", "steps": 0}))
    cells = row.cells(["seed"])
    # The columns it always had, unchanged; a sweep's objective, pruned step and run directory beside them.
    assert {k: v for k, v in cells.items() if k not in ("objective", "pruned_at", "run_dir")} == {
        "job": "3",
        "seed": "1",
        "status": "preflight_failed",
        "steps": 0,
        "loss": None,
        "eval_loss": None,
        "eval_exact": None,
        "samples_per_s": None,
        "tokens_per_s": None,
        "wall_time_s": None,
    }
    assert (cells["objective"], cells["pruned_at"], cells["run_dir"]) == (None, None, None)
