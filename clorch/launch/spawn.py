"""Start one rank: its environment, its command line, its log files, its own session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from clorch.env import COLLECTIVE_TIMEOUT_VARIABLE, STORE_FD_VARIABLE, with_rank_defaults, ranks_environ
from clorch.launch.config import LaunchConfig
from clorch.launch.procs import JOB_ID_VARIABLE, LAUNCHER_PID_VARIABLE, SYS_PATH_VARIABLE

RESTART_VARIABLE = "CLORCH_RESTART_COUNT"


def rank_env(
    config: LaunchConfig, local_rank: int, port: int, attempt: int, job_id: str, store_fd: int | None = None
) -> dict[str, str]:
    """The full environment of one rank: the launcher's, the user's `env`, then clorch's variables.

    `store_fd` (rank 0 only): a socket already listening on `port`, for its store.

    The launcher pid and `job_id` mark the rank's descendants too (they
    inherit them), so that `end_leftovers` finds those that leave its session.
    """
    # A launcher that itself runs under torchrun must not pass on the agent's variables:
    # its ranks would then expect the agent to host their store.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_") and k != STORE_FD_VARIABLE}
    env = ranks_environ(env)  # the user's C++ log level, not the launching process's
    env.update(config.env)
    env.update(
        {
            "RANK": str(config.global_rank(local_rank)),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(config.world_size),
            "LOCAL_WORLD_SIZE": str(config.nproc_per_node),
            "GROUP_RANK": str(config.node_rank),
            "MASTER_ADDR": config.master_addr,
            "MASTER_PORT": str(port),
            RESTART_VARIABLE: str(attempt),
            COLLECTIVE_TIMEOUT_VARIABLE: repr(config.collective_timeout),
            LAUNCHER_PID_VARIABLE: str(os.getpid()),
            JOB_ID_VARIABLE: job_id,
            SYS_PATH_VARIABLE: json.dumps(sys.path),
            # Unbuffered: what a rank prints right before it crashes still reaches its log file.
            "PYTHONUNBUFFERED": "1",
        }
    )
    if store_fd is not None:
        env[STORE_FD_VARIABLE] = str(store_fd)
    if config.nproc_per_node > 1:
        # Ranks sharing a node would otherwise each start one thread per core.
        env.setdefault("OMP_NUM_THREADS", "1")
    if config.cuda_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = config.cuda_devices[local_rank]
    return with_rank_defaults(env)


def rank_command(config: LaunchConfig) -> list[str]:
    """The command line every rank runs (the same for all; the environment tells them apart)."""
    return [
        sys.executable,
        "-m",
        "clorch.launch.child",
        "--main",
        config.main,
        "--log-dir",
        config.log_dir,
        "--backend",
        config.backend or "none",
    ]


def spawn_rank(
    config: LaunchConfig, local_rank: int, port: int, attempt: int, job_id: str, store_fd: int | None = None
) -> subprocess.Popen:
    """Start one rank in a new session (so its group id is its pid), output straight to its files.

    Call it from the thread that supervises the job: the rank's parent-death
    signal fires when that *thread* exits. `job_id` names the job among this
    process's jobs (see `rank_env`); `store_fd` is passed to this rank alone.
    """
    rank = config.global_rank(local_rank)
    log_dir = Path(config.log_dir)
    mode = "wb" if attempt == 0 else "ab"
    with open(log_dir / f"rank_{rank}.stdout", mode) as out, open(log_dir / f"rank_{rank}.stderr", mode) as err:
        if attempt:
            banner = f"=== clorch: restart {attempt} of {config.max_restarts} ===\n".encode()
            out.write(banner)
            err.write(banner)
            out.flush()
            err.flush()
        return subprocess.Popen(
            rank_command(config),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=rank_env(config, local_rank, port, attempt, job_id, store_fd),
            pass_fds=() if store_fd is None else (store_fd,),
            start_new_session=True,
        )
