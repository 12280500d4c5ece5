"""A one-rank job trained in the process that checked it: no launcher, no second interpreter.

A sweep's trial is a process forked from a server that imported torch and clorch once
(clorch.sweep.pool). When the trial is one rank on this machine, starting a launcher that
starts a fresh interpreter for that rank would import torch again (seconds, for a trial
that may train for less). Such a trial trains here instead, as the one rank of its job
(clorch.engine.as_rank, which records the run's summary, failure or interrupt itself),
with the environment clorch's launcher would give that rank.

It is taken only where the sweep allowed it (`allow`, in the trial's process) and only
for what the launcher would add nothing to: one node, one rank, no restarts (a restart
needs a process that outlives the rank) and no job timeout (the launcher's watch).
Everything else launches as before.

What stays the same as a launched rank, and why it matters for the weights: the rank's
variables (RANK=0, WORLD_SIZE=1, ...), the collective timeout, a store on a socket chosen
here, the CUDA device the plan names, and the number of CPU threads a fresh interpreter
would have started with (torch reads OMP_NUM_THREADS when it is imported, which the
server did before this trial's cores and variables were set).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from clorch.env import COLLECTIVE_TIMEOUT_VARIABLE, STORE_FD_VARIABLE, DistEnv, ranks_environ, with_rank_defaults
from clorch.launch.external import ExternalRank
from clorch.launch.gpus import resolve_ranks
from clorch.status import Status

_allowed = [False]


def allow() -> None:
    """Let this process train its job here when it is one rank (called in a sweep's trial)."""
    _allowed[0] = True


def trains_here(plan: Any) -> bool:
    """Whether `plan`'s job trains in this process: allowed, and one rank that needs no launcher."""
    launcher = plan.config.launcher
    return (
        _allowed[0]
        and not launcher.torch_agent
        and launcher.nnodes == 1
        and plan.nproc_per_node == 1
        and launcher.max_restarts == 0
        and launcher.timeout is None
    )


def train_here(plan: Any, run_dir: Path) -> Status:
    """Train `plan`'s one rank in this process; rank 0 writes the run's outputs. Returns its status.

    The rank's store listens on a socket bound here (as the launcher hands rank 0 one), so no
    other process can take its port in between.
    """
    from clorch.engine.as_rank import IN_PROCESS, run_checked  # lazy: as_rank imports the plan's checks

    listener = socket.create_server(("127.0.0.1", 0))
    os.set_inheritable(listener.fileno(), False)
    try:
        _set_rank_environ(plan, listener)
        _set_threads()
        rank = ExternalRank(IN_PROCESS, f"trial-{os.getpid()}", _env(listener.getsockname()[1]))
        return run_checked(plan, run_dir, rank, plot=True)
    finally:
        listener.close()


def _env(port: int) -> DistEnv:
    return DistEnv(rank=0, world_size=1, local_rank=0, local_world_size=1, master_addr="127.0.0.1", master_port=port)


def _set_rank_environ(plan: Any, listener: socket.socket) -> None:
    """The variables clorch's launcher gives its rank (clorch.launch.spawn.rank_env), here."""
    env = with_rank_defaults(ranks_environ(dict(os.environ)))
    env.update(
        {
            COLLECTIVE_TIMEOUT_VARIABLE: repr(float(plan.config.launcher.collective_timeout)),
            STORE_FD_VARIABLE: str(listener.fileno()),
        }
    )
    problems: list[str] = []  # the plan's ranks were checked: none here
    _, cuda_devices, _ = resolve_ranks(1, plan.devices, plan.backend, env, problems)
    if cuda_devices:  # the one device the launcher would give its rank (launcher.devices, else the first)
        env["CUDA_VISIBLE_DEVICES"] = cuda_devices[0]
    os.environ.clear()
    os.environ.update(env)


def _set_threads() -> None:
    """torch's CPU threads as a fresh interpreter would have them: OMP_NUM_THREADS, else this
    process's cores."""
    import torch  # lazy: imported already where a trial runs; kept out of clorch-train's start

    value = os.environ.get("OMP_NUM_THREADS", "")
    threads = int(value) if value.isdigit() and int(value) > 0 else len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
