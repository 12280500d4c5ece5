"""`clorch-train` as one rank of a job torchrun, srun or submitit started (see clorch.launch.external),
and the ranks of `launcher=torchrun` (`main`, which receive the launch plan).

Under an outside launcher every process composes and checks the config itself
(a config error is printed once per node, by local rank 0), joins the job's process group from the
launcher's variables and trains as its rank; nothing is spawned. The run
directory must be the same path on every node (a shared filesystem, as for
checkpoints): `outputs/<launcher>-<run id>` unless `hydra.run.dir` names one.
Rank 0 writes config.yaml, env.json (which launcher ran the job), metrics.jsonl
and summary.json, then sends the run to its experiment trackers (logger.trackers;
a job that succeeded only: the launcher ends a failing job's ranks first). A restart
by the agent (torchrun --max-restarts) resumes from the latest checkpoint in that
directory, as clorch's own restarts do.
A failing rank exits non-zero; the external launcher then ends the others.

After a preflight (preflight=true or only, the default on several nodes) every rank
learns rank 0's verdict (one broadcast). When it failed, rank 0 writes summary.json
(preflight_failed) before any rank leaves, each node's local rank 0 prints the failing
ranks and their hosts, and every rank exits 1, so that every node's launcher reports
the job failed. Under `launcher=torchrun` (`main`) the ranks exit 0 instead and leave the
verdict to the process that started them, which exits 1 on every node (torch's agent
would restart ranks that exit 1).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from clorch.config.checks import ConfigError, print_config_errors
from clorch.config.overrides import compose_once
from clorch.plan.plan import for_world_size, plan_or_errors, run_errors_as_config_errors
from clorch.plan.plan_file import read_plan
from clorch.engine import rank_end
from clorch.engine.footprint import using_run_dir
from clorch.engine.interrupts import Interrupted, interrupts_raise
from clorch.engine.outputs import rank0_result_path, write_json
from clorch.engine.run import owning_checkpoint_dir
from clorch.engine.results import JobEnd, NodeResult, PreflightVerdict, RankResult, RunSummary
from clorch.engine.summary import preflight_lines, show, summarize, summary_lines, write_start, write_summary
from clorch.engine.tracking import feed_at_end
from clorch.env import restart_count
from clorch.launch.child import resolve_target
from clorch.launch.external import detect, rank_environ
from clorch.status import Status

REPORT_GRACE_S = 10.0
# The launcher of a job whose one rank clorch trains in the process that checked it
# (clorch.engine.in_process): its summary.json names no outside launcher, as a launched run's.
IN_PROCESS = "clorch"


def run_dir_for(rank: Any, overrides: list[str]) -> Path:
    """`hydra.run.dir` if an override sets it, else outputs/<launcher>-<run id>."""
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep and key.lstrip("+") == "hydra.run.dir":
            return Path(value).expanduser().resolve()
    return (Path("outputs") / rank.run_name).resolve()


def _report_errors(errors: list[str], rank: Any, always: bool = False) -> Status:
    """Print the config errors once per node (local rank 0, or this rank when `always`);
    return the status (config_error)."""
    if rank.env.local_rank == 0 or always:
        print_config_errors(errors)
    else:
        # Leave the node's local rank 0 (which found the same errors) time to print them before
        # this exit makes the launcher end every rank of the node.
        time.sleep(REPORT_GRACE_S)
    return Status.CONFIG_ERROR


def _train(
    plan: Any,
    run_dir: Path,
    rank: Any,
    worker: str | None = None,
    verdict_failed: Callable[[RankResult], None] | None = None,
) -> RankResult:
    """Join the job's process group and train as this rank, with the engine's worker
    (or `worker`, "module:function" taking the launcher's context, as `execute(worker=)`).

    With the engine's worker and a preflight, every rank learns the job's verdict
    (`_shared_verdict`); when it failed, rank 0 calls `verdict_failed` with its result
    before any rank leaves the group, so that the record is written before a rank's
    exit makes the launcher end the others.
    """
    # lazy: clorch.distributed imports torch, kept out of clorch-train's start
    from clorch.distributed import barrier, destroy_process_group, init_process_group

    # lazy: clorch.train.worker imports torch, kept out of clorch-train's start
    from clorch.train.worker import train

    os.environ.update(rank_environ(rank))
    init_process_group(plan.backend, timeout=plan.config.launcher.collective_timeout)
    try:
        ctx = {
            "rank": rank.env.rank,
            "world_size": rank.env.world_size,
            "local_rank": rank.env.local_rank,
            "backend": plan.backend,
            "args": {"plan": plan.to_dict(), "run_dir": str(run_dir)},
        }
        if worker is not None:
            return RankResult.from_dict(resolve_target(worker)(ctx))
        result = RankResult.from_dict(train(plan, run_dir, ctx))
        if plan.preflight != "false":
            result.preflight = _shared_verdict(result.preflight)
            if not result.preflight.passed:
                if rank.env.rank == 0 and verdict_failed is not None:
                    verdict_failed(result)
                barrier()  # every rank waits for rank 0's record (see above)
        return result
    finally:
        destroy_process_group()


def _shared_verdict(verdict: PreflightVerdict | None) -> PreflightVerdict:
    """Rank 0's preflight verdict, on every rank (the worker returns it on rank 0 only).

    Every rank of the job must call it, once the worker returned: a broadcast from
    rank 0 in the job's group, which blocks until rank 0 arrives (the group's
    collective timeout at most) and raises the group's error when a rank is gone.
    """
    # lazy: torch, kept out of clorch-train's start
    import torch.distributed as dist

    box = [verdict.to_dict() if verdict is not None else None]
    dist.broadcast_object_list(box, src=0)
    return PreflightVerdict.from_dict(box[0]) or PreflightVerdict(failures=["rank 0 returned no verdict"])


def run_as_rank(overrides: list[str], rank: Any) -> int:
    """Compose, check, and train as this rank; returns the exit status."""
    cfg, errors = compose_once([o for o in overrides if not o.partition("=")[0].lstrip("+~").startswith("hydra")])
    if cfg is None:
        return _report_errors(errors, rank).exit_code
    return train_as_rank(cfg, run_dir_for(rank, overrides), rank, errors).exit_code


def train_as_rank(
    cfg: Any, run_dir: Path, rank: Any, errors: list[str] | tuple = (), base: str | None = None
) -> Status:
    """Check the composed config and train as this rank; returns the job's status as this
    rank knows it (its exit code is the same on every rank: `run_checked`).

    The Hydra job calls it directly when it runs as one task of a submitit job
    (hydra/launcher=submitit_*), with Hydra's output directory as `run_dir` and the
    directory the user ran from as `base` (relative paths are relative to it).
    """
    # No launching process of clorch's checked this job: every rank is an entry of its own
    # and checks the same (read-only) things, so that an error stops all of them before any
    # waits for the others in the process group.
    plan, found = plan_or_errors(cfg, run_dir, external=rank, base=base)
    errors = [*errors, *(e for e in found if e not in errors)]
    if errors:
        return _report_errors(errors, rank)
    return run_checked(plan, run_dir, rank)


def _rank0_holds(plan: Any, run_dir: Path, rank: Any) -> tuple[Any, Any]:
    """The contexts rank 0 trains inside: using the run directory, and holding the checkpoint
    directory for the job (the launcher's job id: a restarted rank 0 of the same job takes it
    again), since rank 0 writes the checkpoints (save_checkpoint). Other ranks: none."""
    if rank.env.rank != 0:
        return contextlib.nullcontext(), contextlib.nullcontext()
    return using_run_dir(run_dir), owning_checkpoint_dir(plan, run_dir, f"{rank.launcher} {rank.run_id}")


def _rank_failed(plan: Any, run_dir: Path, rank: Any, start: float, exc: Exception) -> Status:
    """A rank that raised: its traceback and one line on stderr, and summary.json (unless a rank
    was first); failed, and the launcher ends the other ranks."""
    traceback.print_exc()
    print(
        f"clorch-train: rank {rank.env.rank} of the {rank.launcher} job failed (run directory {run_dir})",
        file=sys.stderr,
        flush=True,
    )
    rank_end.failed(plan, run_dir, rank, start, exc)
    return Status.FAILED


def run_checked(plan: Any, run_dir: Path, rank: Any, plot: bool = False) -> Status:
    """Train as this rank from a checked plan; rank 0 writes the run's outputs (with loss.png
    when `plot`: the ranks of an outside launcher's job leave it to `clorch-runs plot`).

    Returns the job's status as this rank knows it, whose exit code is the same on every
    rank of every node: a failed preflight is preflight_failed everywhere (exit 1), its
    failures on each node's console. A rank that fails returns failed (the launcher then
    ends the others).
    """
    if rank.env.rank == 0:
        rank_end.clear(run_dir)
        write_start(plan, run_dir, launcher=rank.launcher, run_id=rank.run_id)
        print(_described(plan, rank), flush=True)
    start = time.perf_counter()
    record = functools.partial(_record, plan, run_dir, rank, start, plot)
    try:
        using, holding = _rank0_holds(plan, run_dir, rank)
        with run_errors_as_config_errors(), using, holding, interrupts_raise():
            result = _train(plan, run_dir, rank, verdict_failed=record)
    except ConfigError as exc:
        return _report_errors(exc.errors, rank, always=True)
    except Interrupted as exc:  # the launcher's SIGTERM (it was signalled, or another rank failed)
        rank_end.interrupted(plan, run_dir, rank, start, exc.signal_name)
        return Status.INTERRUPTED
    except Exception as exc:
        return _rank_failed(plan, run_dir, rank, start, exc)
    failed = result.preflight is not None and not result.preflight.passed
    if failed:  # rank 0 recorded it inside the group; each node's console says it
        if rank.env.local_rank == 0:
            show(preflight_lines(result.preflight, plan.world_size, run_dir, table=rank.env.rank == 0))
        return Status.PREFLIGHT_FAILED
    if rank.env.rank == 0:
        summary = record(result)
        show(summary_lines(summary, str(run_dir)))
        # After training, from metrics.jsonl: no tracker call ever waits inside a training step.
        feed_at_end(plan, run_dir, summary.status)
    return Status.SUCCEEDED


def _described(plan: Any, rank: Any) -> str:
    """The run's one-line description, naming the outside launcher whose rank this is."""
    if rank.launcher == IN_PROCESS:  # the job's one rank, as clorch runs it
        return plan.describe()
    return plan.describe().replace("clorch: running", f"clorch: rank of a {rank.launcher} job,")


def _record(plan: Any, run_dir: Path, rank: Any, start: float, plot: bool, result: RankResult) -> RunSummary:
    """Rank 0: write summary.json of the job that ran (the launcher's own state is not known
    here: a failing rank ends the job before rank 0 could record it)."""
    end = JobEnd.from_launcher({"state": Status.SUCCEEDED, "attempts": [None] * (restart_count() + 1)})
    end.results = [result]
    summary = summarize(end, run_dir, plan, time.perf_counter() - start)
    summary.launcher = None if rank.launcher == IN_PROCESS else rank.launcher  # as a launched run's
    write_summary(run_dir, summary, plot=plot)
    return summary


def _plan_from_file(plan_path: Path, run_dir: Path, rank: Any) -> tuple[Any, list[str]]:
    """The plan the launching process checked and wrote, for the world the rendezvous formed."""
    try:
        plan = read_plan(plan_path)
    except ValueError as exc:
        return None, [str(exc)]
    return for_world_size(plan, rank.env.world_size, run_dir)


def main(argv: list[str] | None = None) -> int:
    """`python -m clorch.engine.as_rank --plan FILE --run-dir DIR [--worker M:F]`: a rank
    under `launcher=torchrun`.

    The launching process checked the config and wrote its plan (clorch.plan.plan_file.write_plan);
    each rank reads it, checks its digest, and adapts only the step arithmetic when the
    rendezvous formed another world size (an elastic nnodes range).
    """
    parser = argparse.ArgumentParser(prog="python -m clorch.engine.as_rank")
    parser.add_argument("--plan", required=True, type=Path)
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--worker", default=None, help="module:function (default: the engine's worker)")
    options = parser.parse_args(argv)
    rank = detect()
    if rank is None:
        parser.error("run it under torchrun (launcher=torchrun does): no RANK/TORCHELASTIC_RUN_ID")
    plan, errors = _plan_from_file(options.plan, options.run_dir, rank)
    if errors:
        return _report_errors(errors, rank).exit_code
    try:
        result = _train(plan, options.run_dir, rank, options.worker)
    except Exception:
        traceback.print_exc()
        return Status.FAILED.exit_code  # the launcher ends the other ranks
    # The ranks exit 0 after a failed preflight too: the launching process of each node says
    # preflight_failed from this record (an exit 1 would have torch's agent restart them).
    if rank.env.local_rank == 0:  # for the launching process, which puts it into summary.json
        node = NodeResult(
            rank0=rank.env.rank == 0,
            result=result if rank.env.rank == 0 else None,
            preflight=result.preflight,
            restarts=restart_count(),
        )
        # The elastic agent runs inside the launching process, which started this rank.
        write_json(rank0_result_path(options.run_dir, os.getppid()), node.to_dict())
    return Status.SUCCEEDED.exit_code


if __name__ == "__main__":
    from clorch.launch.child import exit_without_finalizing

    exit_without_finalizing(main())  # gloo's threads can abort in interpreter finalization
