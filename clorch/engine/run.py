"""Run one job from its launch plan: launch, follow, report.

This is the launching process's side (the ranks run `clorch.train.worker`).
`execute(plan, run_dir)` is what `clorch-train` (inside its Hydra job) and
`clorch.run_local` call with the plan `clorch.plan.plan` made of the config.
The run's experiment trackers (logger.trackers) are fed from here, from rank 0's
metrics.jsonl (clorch.engine.tracking), never from the ranks' training step.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Iterator

from clorch.plan.plan import Plan
from clorch.plan.plan_file import write_plan
from clorch.engine.footprint import using_run_dir
from clorch.engine.interrupts import Interrupted, raise_if_signalled
from clorch.engine.outputs import rank0_result_path
from clorch.train.metrics import announce
from clorch.engine.progress import Progress
from clorch.engine.results import JobEnd, NodeResult, RankResult, RunResult
from clorch.engine.summary import summarize, write_start, write_summary
from clorch.status import Status
from clorch.engine.tracking import NO_TRACKERS, TrackerFeed, feed_at_end, tracker_feed
from clorch.launch import launch
from clorch.launch.slurm import layout_taken
from clorch.launch.torchrun import TorchrunError, run_torchrun

POLL_S = 0.25
WORKER = "clorch.train.worker:main"


def node_log_dir(plan: Plan, run_dir: Path) -> Path:
    """Where this node's launcher keeps its logs, job.json, args.json and the ranks' plan.pkl:
    `run_dir/logs` on node 0, `run_dir/logs/node<k>` on node k > 0, so that the nodes of a job
    sharing one run directory do not overwrite each other's records. The node is
    `launcher.node_rank`, or SLURM's node id where the launcher takes its layout from SLURM
    (nnodes and node_rank left at 1 and 0)."""
    launcher, layout = plan.config.launcher, None
    with contextlib.suppress(ValueError):  # malformed SLURM variables: the launcher names them
        layout = layout_taken(launcher.nnodes, launcher.node_rank, os.environ)
    node = layout.node_rank if layout is not None else launcher.node_rank
    return run_dir / "logs" if node == 0 else run_dir / "logs" / f"node{node}"


PLAN_FILE = "plan.pkl"  # in the node's log directory: the plan its ranks run, with its digest


def _launch(plan: Plan, run_dir: Path, worker: str, plan_file: Path) -> Any:
    """Start this node's ranks; they read their plan from `plan_file` (`write_plan`), beside
    which the launcher keeps its logs."""
    launcher, log_dir = plan.config.launcher, plan_file.parent
    return launch(
        worker,
        nproc_per_node=plan.nproc_per_node,
        devices=plan.devices,
        backend=plan.backend,
        timeout=launcher.timeout,
        args={"plan_file": str(plan_file), "run_dir": str(run_dir)},
        log_dir=log_dir,
        nnodes=launcher.nnodes,
        node_rank=launcher.node_rank,
        master_addr=launcher.master_addr,
        master_port=launcher.master_port,
        max_restarts=launcher.max_restarts,
        rdzv_timeout=launcher.rdzv_timeout,
        collective_timeout=launcher.collective_timeout,
    )


def _follow(job: Any, progress: Progress, feed: TrackerFeed = NO_TRACKERS) -> dict[str, Any]:
    """Wait for the job, showing progress and forwarding each new metrics record to `feed`'s
    trackers (started here; the caller finishes them once the run's outputs are written).

    Anything that ends the wait early (Ctrl-C, an error while showing progress)
    stops the ranks before re-raising, so none keeps running unwatched.
    """
    restarts_shown, limit = 0, job.config["max_restarts"]
    try:
        # While the ranks start (importing torch takes them longer): the records wait in
        # metrics.jsonl meanwhile, and a signal during a slow start still stops the ranks.
        feed.start()
        while True:
            raise_if_signalled()  # a first signal dropped on its way up still stops the ranks
            try:
                status = job.wait(timeout=POLL_S)
                break
            except TimeoutError:
                restarts_shown = _announce_restarts(job.status(), restarts_shown, limit, progress)
                feed.log(progress.poll())
    except BaseException:
        job.stop()
        raise
    finally:
        feed.log(progress.close())  # the records written since the last poll
    return status


def _announce_restarts(status: dict[str, Any], shown: int, limit: int, progress: Progress) -> int:
    """Say "restart k of n" (and the failure that caused it) once per new restart; return the count."""
    end = JobEnd.from_launcher(status)
    count, causes = end.restart_count, end.attempt_errors
    for number in range(shown + 1, count + 1):
        cause = causes[number - 1] if number - 1 < len(causes) else None
        what = cause.describe() if cause else "a failure"
        # Recorded in events.jsonl; the progress shows it from there, like the ranks' events.
        announce(progress.path.parent, f"restart {number} of {limit} after {what}; resuming from the latest checkpoint")
    return max(count, shown)


def execute(
    plan: Plan, run_dir: str | Path, *, progress: str | None = None, echo: bool = True, worker: str = WORKER
) -> RunResult:
    """Launch the ranks of a checked plan, wait, and write the run's outputs into `run_dir`.

    Args:
        plan: the launch plan `clorch.plan.plan.resolve(cfg, run_dir)` made of a config
            (checking happens there, once; the engine builds and runs what it is given).
        run_dir: the run directory (created if missing).
        progress: "auto", "bar", "lines" or "off"; None reads logger.progress.
        echo: print the one-line description of where the job runs.
        worker: the ranks' entry point, "module:function" taking the launcher's context
            (`clorch.train.worker.plan_of(ctx)` reads the plan from it).

    Returns:
        A RunResult: how the job ended (`.job`), summary.json's content (`.summary`, whose
        `.status` says it all: clorch.status.Status), the run directory, the plan and
        the ranks' logs ({rank: {"stdout", "stderr"}}); indexing it as the dict of earlier
        versions (`result["status"]["state"]`) still works.

    Raises:
        TypeError: `plan` is not a Plan (compose and resolve a config first).
        DirectoryInUse: another live job holds the checkpoint directory.
    """
    if not isinstance(plan, Plan):
        raise TypeError(
            f"execute() takes the Plan clorch.plan.plan.resolve(cfg, run_dir) returns, got {type(plan).__name__}"
        )
    run_dir = Path(run_dir).resolve()
    agent = plan.config.launcher.torch_agent
    # In use while the run lives: a launch refused meanwhile never takes this run's files back.
    with using_run_dir(run_dir), owning_checkpoint_dir(plan, run_dir):
        write_start(plan, run_dir)
        if echo:
            print(plan.describe(), flush=True)
        start = time.perf_counter()
        plan_file = _plan_file(plan, run_dir)
        write_plan(plan, plan_file)  # the ranks run what it holds
        raise_if_signalled()  # no ranks once a signal has fired, even one whose Interrupted was dropped
        try:
            if agent:
                return _execute_torchrun(plan, run_dir, plan_file, start, None if worker == WORKER else worker)
            return _execute(plan, run_dir, plan_file, start, progress, worker)
        finally:
            if agent:  # (clorch's launcher keeps plan.pkl among the run's logs)
                plan_file.unlink(missing_ok=True)


def _plan_file(plan: Plan, run_dir: Path) -> Path:
    """Where this node's ranks read their plan: `plan.pkl` in the node's log directory (made
    here), or, under torchrun's agent, a hidden file of this process's in the run directory
    (nodes sharing the run directory each write their own; removed when the agent returns)."""
    if plan.config.launcher.torch_agent:
        return run_dir / f".plan-{socket.gethostname()}-{os.getpid()}.pkl"
    log_dir = node_log_dir(plan, run_dir)
    log_dir.mkdir(parents=True, exist_ok=True)  # (the run directory was checked writable)
    return log_dir / PLAN_FILE


@contextlib.contextmanager
def owning_checkpoint_dir(plan: Plan, run_dir: Path, job: str | None = None) -> Iterator[None]:
    """Hold the run's checkpoint directory (clorch.checkpoint.locks) while the run lives.

    The lock belongs to the job: the processes that give the same `job` (by default
    `job_id(plan)`: the nodes of one multi-node job) share it.

    Raises:
        DirectoryInUse: another live job holds it (its pid, host, job and run directory named);
            `clorch.plan.plan.run_errors_as_config_errors` reports it as checkpoint.dir's error.
    """
    if plan.config.checkpoint.policy == "none":
        yield
        return
    # lazy: clorch.checkpoint.locks imports torch, kept out of clorch-train's start
    from clorch.checkpoint.locks import DirectoryLock

    # lazy: clorch.train.checkpoints imports torch, kept out of clorch-train's start
    from clorch.train.checkpoints import checkpoint_dir

    job = job_id(plan) if job is None else job
    lock = DirectoryLock(checkpoint_dir(plan.config, run_dir), {"run_dir": str(run_dir)}, job).acquire()
    try:
        yield
    finally:
        lock.release()


def job_id(plan: Plan) -> str | None:
    """The id every node of a multi-node job computes alike from its config, or None (one node).

    torchrun's nodes meet at rdzv_endpoint under rdzv_id; clorch's own launcher's nodes at
    master_addr:master_port (or, left at one node inside a SLURM allocation of several, SLURM's
    job and step, where the launcher reads its layout). Each names the job: two jobs cannot
    meet at one place at once.
    """
    launcher = plan.config.launcher
    if launcher.torch_agent:
        return f"torchrun rdzv_id={launcher.rdzv_id} at {launcher.rdzv_endpoint}"
    if launcher.nnodes != 1:
        return f"nodes at {launcher.master_addr}:{launcher.master_port}"
    if os.environ.get("SLURM_JOB_ID") and os.environ.get("SLURM_NNODES", "1") != "1":
        return f"slurm {os.environ['SLURM_JOB_ID']}.{os.environ.get('SLURM_STEP_ID', '')}"
    return None


def _execute(plan: Plan, run_dir: Path, plan_file: Path, start: float, progress: str | None, worker: str) -> RunResult:
    """clorch's launcher runs this node's ranks, which read `plan_file`; follow them, then report."""
    job = _launch(plan, run_dir, worker, plan_file)
    mode = progress or plan.config.logger.progress
    # Node 0's launching process hosts rank 0, which writes metrics.jsonl (the launcher's layout,
    # SLURM's included, decides which node that is).
    feed = tracker_feed(plan, run_dir) if job.config["node_rank"] == 0 else NO_TRACKERS
    try:
        status = _follow(job, Progress(run_dir / "metrics.jsonl", plan.total_steps, mode), feed)
        end = JobEnd.from_launcher(status)
    except Interrupted as exc:  # _follow stopped the ranks; record the run as interrupted
        end = JobEnd.from_launcher(job.status(), state=Status.INTERRUPTED, interrupted_by=exc.signal_name)
    summary = summarize(end, run_dir, plan, time.perf_counter() - start)
    write_summary(run_dir, summary)
    feed.finish(summary.status, run_dir)
    logs = {rank: job.logs(rank) for rank in (end.ranks or range(plan.nproc_per_node))}
    return RunResult(job=end, summary=summary, run_dir=str(run_dir), plan=plan, logs=logs, preflight=summary.preflight)


def _one_node(nnodes: int | str) -> bool:
    """Whether torchrun's `nnodes` (N, or "MIN:MAX") allows one node only."""
    return str(nnodes).rpartition(":")[2].strip() == "1"


def _execute_torchrun(plan: Plan, run_dir: Path, plan_file: Path, start: float, worker: str | None) -> RunResult:
    """`launcher=torchrun`: torch's elastic agent runs this node's ranks (clorch.launch.torchrun),
    which read `plan_file`."""
    # lazy: keeps torch out of clorch-train's start
    from torch.distributed.elastic.multiprocessing.api import SignalException

    try:
        run_torchrun(
            plan.config.launcher, plan.nproc_per_node, plan_file, run_dir, worker, entry="clorch.engine.as_rank"
        )
        end = JobEnd.from_launcher({"state": Status.SUCCEEDED})
    except TorchrunError as exc:
        end = JobEnd.from_launcher({"state": "failed", "error": {"type": "TorchrunError", "message": str(exc)}})
    except (SignalException, Interrupted) as exc:
        # torch's agent has its own SIGINT/SIGTERM/SIGHUP handlers: it ends the ranks, then
        # raises this; the run is recorded as interrupted, as under clorch's launcher.
        signum = getattr(exc, "sigval", None) or getattr(exc, "signum")
        end = JobEnd.from_launcher(
            {"state": Status.INTERRUPTED, "interrupted_by": Interrupted(int(signum)).signal_name}
        )
    node = _node_result(run_dir)
    if node.rank0:  # rank 0 ran here: this node writes the summary
        end.results, end.attempts = [node.result or RankResult()], node.restarts + 1
    end.raw.update(state=str(end.state), results=[r.to_dict() for r in end.results])
    summary = summarize(end, run_dir, plan, time.perf_counter() - start)
    summary.launcher = "torchrun"
    if not node.rank0 and end.state is Status.SUCCEEDED and node.preflight is not None and not node.preflight.passed:
        # Another node's rank 0 writes summary.json; this node's ranks learnt the job's verdict.
        summary.status, summary.preflight = Status.PREFLIGHT_FAILED, node.preflight
    if end.results or end.state is not Status.SUCCEEDED:
        write_summary(run_dir, summary)
    if end.results or _one_node(plan.config.launcher.nnodes):
        feed_at_end(plan, run_dir, summary.status)  # torch's agent held this process until now
    return RunResult(
        job=end, summary=summary, run_dir=str(run_dir), plan=plan, preflight=node.preflight or summary.preflight
    )


def _node_result(run_dir: Path) -> NodeResult:
    path = rank0_result_path(run_dir)
    if not path.is_file():
        return NodeResult()
    record = json.loads(path.read_text())
    path.unlink()
    return NodeResult.from_dict(record)
