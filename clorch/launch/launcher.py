"""`launch()` and the functional API over `Job` (job_status, await_job, job_logs, stop_job)."""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from clorch.status import Status
from clorch._files import write_json_atomic
from clorch.launch import signals
from clorch.launch.config import LaunchConfig, build_config
from clorch.launch.job import RECORD, Job
from clorch.launch.spawn import rank_command
from clorch.launch.supervisor import run_job


def launch(
    main: str | Callable[[dict[str, Any]], Any],
    *,
    nproc_per_node: int | None = None,
    devices: Sequence[int] | None = None,
    args: Any = None,
    backend: str | None = "auto",
    timeout: float | None = None,
    log_dir: str | os.PathLike | None = None,
    env: Mapping[str, str] | None = None,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    max_restarts: int = 0,
    grace_period: float = 10.0,
    rdzv_timeout: float = 600.0,
    collective_timeout: float = 600.0,
) -> Job:
    """Start `nproc_per_node` ranks of `main` on this node and return at once with a `Job`.

    Each rank is a fresh interpreter that joins the process group and calls
    `main(ctx)`, ctx = {"rank", "local_rank", "world_size", "backend",
    "process_group", "args"}. See the `clorch.launch` module docstring for
    the environment, failure handling, logs and multi-node use.

    Args:
        main: "package.module:function", or a module-level function.
        nproc_per_node: ranks on this node; default len(devices), else the
            visible GPU count, else 2 CPU ranks.
        devices: CUDA device indices, one per local rank.
        args: JSON-serializable value passed to main as ctx["args"].
        backend: "auto" (nccl on GPUs, else gloo), "nccl", "gloo", or None for
            no process group (the ranks do not import torch).
        timeout: seconds for the whole job, restarts included; then "timed_out".
        log_dir: where logs and the record go; None makes a fresh temp dir.
        env: extra environment variables for every rank.
        nnodes, node_rank, master_addr, master_port: the multi-node layout;
            SLURM variables fill nnodes/node_rank (and the master) left at defaults.
        max_restarts: restart the whole group after a failure up to this many times.
        grace_period: seconds between SIGTERM and SIGKILL when ending ranks.
        rdzv_timeout: with nnodes > 1, seconds each node's launcher waits for
            the others before any rank starts; then the job fails with a
            message naming the endpoint, the nodes that joined and the timeout.
        collective_timeout: seconds a rank waits in one collective (a rank
            that skipped it, a hung peer) before it fails and the job ends;
            also the ranks' wait for each other when the group starts.

    Returns:
        The running job's handle; the launching process keeps a supervisor
        thread (non-daemon: the interpreter waits for the job before exiting).

    Raises:
        TypeError: `main`, `args` or `env` of the wrong type.
        ValueError: any other invalid argument; nothing has started.
    """
    config = build_config(
        main,
        nproc_per_node=nproc_per_node,
        devices=devices,
        args=args,
        backend=backend,
        timeout=timeout,
        log_dir=log_dir,
        env=env,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
        max_restarts=max_restarts,
        grace_period=grace_period,
        rdzv_timeout=rdzv_timeout,
        collective_timeout=collective_timeout,
    )
    return _start(_with_log_dir(config))


def _start(config: LaunchConfig) -> Job:
    """Write the job's first record and start the thread that supervises its ranks; return at once.

    The thread is not a daemon: the interpreter waits for the job before exiting. The job is
    registered with the signal handlers while it runs: a SIGINT or SIGTERM to this process is
    forwarded to its ranks (see `clorch.launch.signals`)."""
    job = Job(Path(config.log_dir), _initial_record(config), owner=True)
    write_json_atomic(Path(config.log_dir) / RECORD, job._record, indent=1)
    signals.install()
    signals.register(job)

    def supervise() -> None:
        try:
            run_job(job, config)
        finally:
            signals.unregister(job)

    job._thread = threading.Thread(target=supervise, name=f"clorch-job-{Path(config.log_dir).name}")
    job._thread.start()
    return job


def _with_log_dir(config: LaunchConfig) -> LaunchConfig:
    if config.log_dir:
        try:
            Path(config.log_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"log_dir {config.log_dir!r} cannot be created: {exc}") from None
        path = config.log_dir
    else:
        path = tempfile.mkdtemp(prefix="clorch-job-")
    (Path(path) / "args.json").write_text(config.args_json)
    return replace(config, log_dir=path)


def _initial_record(config: LaunchConfig) -> dict[str, Any]:
    ranks = [config.global_rank(r) for r in range(config.nproc_per_node)]
    none = [None] * config.world_size
    return {
        "version": 1,
        "config": config.to_json(),
        "command": rank_command(config),
        "launcher_pid": os.getpid(),
        "host": socket.gethostname(),
        "created_at": time.time(),
        "python": sys.executable,
        "status": {
            "state": Status.RUNNING,
            "log_dir": config.log_dir,
            "world_size": config.world_size,
            "ranks": ranks,
            "pids": [],
            "master_port": config.master_port,
            "restart_count": 0,
            "exit_codes": list(none),
            "signals": list(none),
            "failed_rank": None,
            "error": None,
            "results": list(none),
            "attempts": [],
            "ended_at": None,
        },
    }


def _job(job: Any) -> Job:
    if isinstance(job, Job):
        return job
    if isinstance(job, (str, os.PathLike)):
        return Job.open(job)
    raise TypeError(f"job must be a Job or a log_dir path, got {type(job).__name__}")


def job_status(job: Job | str | os.PathLike) -> dict[str, Any]:
    """The job's status now (non-blocking).

    Returns:
        {"state": "running" | "succeeded" | "failed" | "stopped" | "timed_out",
        "exit_codes", "signals", "results" (lists indexed by global rank;
        None for ranks still running or on other nodes), "failed_rank",
        "error" ({"rank", "type", "message", "traceback", "exit_code",
        "signal"} of the rank that failed first), "attempts" (one record per
        start of the group), "restart_count", "pids", "master_port", "log_dir"}.
    """
    return _job(job).status()


def await_job(job: Job | str | os.PathLike, timeout: float | None = None) -> dict[str, Any]:
    """Block until the job ends and return its final status.

    Raises:
        TimeoutError: still running after `timeout` seconds (the job keeps running).
    """
    return _job(job).wait(timeout)


def job_logs(job: Job | str | os.PathLike, rank: int) -> dict[str, str]:
    """`{"stdout": str, "stderr": str}` of `rank` (global rank on this node), read from disk."""
    return _job(job).logs(rank)


def stop_job(job: Job | str | os.PathLike, timeout: float | None = None) -> dict[str, Any]:
    """Cancel the job: SIGTERM to every rank's process group, SIGKILL after the grace period.

    Blocks until the ranks are gone and returns the final status (state
    "stopped", unless the job had already ended).
    """
    return _job(job).stop(timeout)
