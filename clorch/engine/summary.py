"""A run's records in its directory: config.yaml and env.json when it starts, summary.json
and loss.png when it ends (written by the launching process, or by rank 0 of an outside
launcher's job), and the one-line error the console shows.

The records are typed in clorch.engine.results; the console lines of a run's end are
here, each starting with its status's line (clorch.status.Status.line).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any, Mapping

import yaml

from clorch._files import write_text_atomic
from clorch.plan.plan import Plan
from clorch.plan.resume import nothing_to_resume
from clorch.engine.data_files import data_files
from clorch.engine.outputs import env_record, plot_loss, write_json
from clorch.train.metrics import announce, read_metrics
from clorch.engine.results import JobEnd, JobError, PreflightVerdict, RunSummary, step_of
from clorch.status import Status


def _best(records: list[dict[str, Any]]) -> dict[str, Any]:
    evals = [r for r in records if r.get("kind") == "eval"]
    if not evals:
        return {}
    best = min(evals, key=lambda r: r["eval_loss"])
    return {k: v for k, v in best.items() if k != "kind"}


def job_status(end: JobEnd, preflight: PreflightVerdict | None) -> Status:
    """The run's status: the launcher's, except that a job whose preflight failed (rank 0's
    verdict) failed its preflight, however its ranks exited: they stop, without an error,
    after the verdict, and a rank that was missing from it may fail on its way in once rank 0
    has left (the launcher's error stays in summary.json's `error`)."""
    if preflight is not None and not preflight.passed and end.state in (Status.SUCCEEDED, Status.FAILED):
        return Status.PREFLIGHT_FAILED
    if end.state is Status.SUCCEEDED and end.rank0.pruned_at is not None:
        return Status.PRUNED
    if end.state is Status.SUCCEEDED and end.rank0.paused_at is not None:
        return Status.PAUSED
    return end.state


def summarize(end: JobEnd, run_dir: Path, plan: Plan, wall_s: float) -> RunSummary:
    """summary.json's content: status, final and best metrics, steps, wall time, throughput."""
    records = read_metrics(run_dir / "metrics.jsonl")
    train = [r for r in records if r.get("kind") == "train"]
    rank0 = end.rank0
    final = {k: v for k, v in (train[-1] if train else {}).items() if k != "kind"}
    final.update({f"eval_{k}": v for k, v in rank0.final_eval.items()})
    steps = rank0.steps if rank0.steps is not None else step_of(final)
    return RunSummary(
        status=job_status(end, rank0.preflight),
        exit_codes=end.exit_codes,
        failed_rank=end.failed_rank,
        error=end.error,
        steps=steps,
        planned_steps=plan.total_steps,
        final=final,
        best=_best(records),
        wall_time_s=wall_s,
        train_time_s=rank0.train_time_s,
        samples_per_s=rank0.samples_per_s,
        tokens_per_s=rank0.tokens_per_s,
        weights_sha256=rank0.weights_sha256,
        resumed_from=rank0.resumed_from,
        world_size=plan.world_size,
        backend=plan.backend,
        attempts=end.attempts,
        trusted_modules=plan.trusted_modules,
        exported=rank0.exported,
        interrupted_by=end.interrupted_by or None,
        preflight=rank0.preflight,
        pruned_at=rank0.pruned_at,
        paused_at=rank0.paused_at,
    )


Line = tuple[str, bool]
"""One console line, and whether it goes to stderr (what went wrong does)."""


def shown_metrics(final: Mapping[str, Any]) -> str:
    """The final loss and every eval metric (eval_*, your own eval function's included), as
    `loss 0.1, eval_loss 0.2, eval_accuracy 0.9`: the numbers among them, loss first."""
    keys = ["loss"] + [k for k in final if k.startswith("eval_")]
    return ", ".join(
        f"{k} {final[k]:.4g}"
        for k in keys
        if isinstance(final.get(k), (int, float)) and not isinstance(final.get(k), bool)
    )


def show(lines: list[Line]) -> None:
    for text, to_stderr in lines:
        print(text, file=sys.stderr if to_stderr else sys.stdout, flush=True)


def preflight_lines(
    verdict: PreflightVerdict, world_size: int | None, run_dir: str | Path, table: bool = True
) -> list[Line]:
    """preflight=only, or a preflight that failed: the table (with `table`), then the verdict:
    the status's line and, when it failed, each failure (naming the rank and its host)."""
    lines = [(verdict.table, False)] if table and verdict.table else []
    if verdict.passed:
        return lines + [
            (
                Status.SUCCEEDED.line(
                    f": preflight passed on {world_size} rank(s) in "
                    f"{verdict.elapsed_s:.1f} s; preflight.json in {run_dir}"
                ),
                False,
            )
        ]
    return lines + [
        (Status.PREFLIGHT_FAILED.line(f"; preflight.json in {run_dir}"), True),
        *((f"  - {line}", True) for line in verdict.failures),
    ]


def summary_lines(summary: RunSummary, run_dir: str, final_node: bool = True) -> list[Line]:
    """How a run ended, on the console: its status's line (clorch.status.Status.line)
    with what it knows, and a failure's traceback after it. An interruption's lines, which
    carry the resume hint, are the command line's (clorch.cli.hydra_app).

    Args:
        final_node: this process writes the run's metrics (rank 0's node).
    """
    status = summary.status
    if summary.preflight is not None and (status is Status.PREFLIGHT_FAILED or not summary.steps):
        return preflight_lines(summary.preflight, summary.world_size, run_dir)
    if status is Status.SUCCEEDED and not final_node:
        return [
            (status.line(f"; this node's ranks finished, rank 0's node writes the metrics; logs in {run_dir}"), False)
        ]
    if status is Status.PRUNED:
        shown = shown_metrics(summary.final)
        detail = f" at step {summary.pruned_at} of {summary.planned_steps} by the sweep's pruner"
        return [(status.line(f"{detail}{', ' + shown if shown else ''}; outputs in {run_dir}"), False)]
    if status is Status.PAUSED:
        shown = shown_metrics(summary.final)
        detail = f" at step {summary.paused_at} of {summary.planned_steps} by the sweep's ASHA pruner"
        return [(status.line(f"{detail}{', ' + shown if shown else ''}; outputs in {run_dir}"), False)]
    if status is Status.SUCCEEDED:
        shown = shown_metrics(summary.final)
        return [(status.line(f", {summary.steps} steps{', ' + shown if shown else ''}; outputs in {run_dir}"), False)]
    error = summary.error or JobError()
    what = dataclasses.replace(error, rank=summary.failed_rank).describe(failed="failed first")
    lines = [(status.line(f": {what}; run directory {run_dir}"), True)]
    return lines + ([(error.traceback, True)] if error.traceback else [])


def trusted_comment(trusted: Mapping[str, list[str]]) -> str:
    """YAML comment lines naming the modules trusted for `_target_` (empty when none were)."""
    return "".join(f"# trusted modules ({where}): {', '.join(names)}\n" for where, names in trusted.items())


def write_summary(run_dir: Path, summary: RunSummary, plot: bool = True) -> bool:
    """Write summary.json (and loss.png, with `plot`) into `run_dir`; return whether it could.

    When it cannot (the directory was removed or made read-only while the run lived), it
    says so on stderr instead of ending the run's report with a traceback.
    """
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json(run_dir / "summary.json", summary.to_dict())
    except OSError as exc:
        print(
            f"clorch-train: no summary.json: cannot write it in {run_dir} ({exc.strerror or exc}); "
            f"the run ended {summary.status}",
            file=sys.stderr,
            flush=True,
        )
        return False
    if plot:
        plot_loss(run_dir)
    return True


def record_interrupted_start(run_dir: str | Path, signal_name: str) -> None:
    """summary.json of a run that a signal stopped before it could record its end (its config
    being checked, its ranks starting): interrupted at step 0, so that `clorch-runs ls` lists it.
    A summary already written (the run's own) is kept; a directory that is gone stays gone."""
    run_dir = Path(run_dir)
    if run_dir.is_dir() and not (run_dir / "summary.json").exists():
        write_summary(run_dir, RunSummary(status=Status.INTERRUPTED, steps=0, interrupted_by=signal_name), plot=False)


def write_start(plan: Plan, run_dir: Path, **extra: Any) -> None:
    """Create `run_dir` and write config.yaml (the checked config) and env.json (machine, the data
    files' digests, plan, `extra`); a `checkpoint.resume=latest` that finds nothing to resume says
    so in events.jsonl (the console showed it in the plan's description)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    nothing = nothing_to_resume(plan.config, run_dir, plan.layout)
    if nothing is not None:  # the line as the console showed it (the directory may exist by now)
        announce(run_dir, plan.resume_note or nothing, resumed_from=None)
    # Atomic: under launcher=torchrun every node writes it, while other nodes' ranks may read it.
    write_text_atomic(
        run_dir / "config.yaml",
        trusted_comment(plan.trusted_modules) + yaml.safe_dump(plan.config.to_dict(), sort_keys=False),
    )
    shown = {k: v for k, v in plan.to_dict().items() if k != "config"}
    # The data files' digests: `clorch-runs verify` names a file that changed since (clorch.engine.data_files).
    record = {**env_record(), "data_files": data_files(plan.config), **extra, "plan": shown}
    write_json(run_dir / "env.json", record)
