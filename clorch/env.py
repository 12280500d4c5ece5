"""The standard distributed environment variables, read and checked (no torch import).

clorch's launcher, torchrun and a SLURM script (with the usual exports) all
set the same six variables; this module turns them into one typed record so
that a missing or malformed value is reported by name before any socket opens.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Mapping

REQUIRED_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
OPTIONAL_VARIABLES = ("LOCAL_RANK", "LOCAL_WORLD_SIZE")
COLLECTIVE_TIMEOUT_VARIABLE = "CLORCH_COLLECTIVE_TIMEOUT"  # seconds; read by init_process_group
# Set by clorch's launcher for rank 0 alone when it chose the port: the descriptor of a socket
# already listening on MASTER_PORT, which rank 0's store takes over (read by init_process_group).
STORE_FD_VARIABLE = "CLORCH_STORE_FD"

# NVLink multicast (NVLS) can put a shared host's GPUs out of service; clorch
# keeps it off in every environment it builds, unless the user set a value.
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


@dataclass(frozen=True)
class DistEnv:
    """One rank's place in the job, as the environment describes it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int


def _int_var(environ: Mapping[str, str], name: str, minimum: int) -> int:
    raw = environ[name]
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"environment variable {name} must be >= {minimum}, got {value}")
    return value


def read_env(environ: Mapping[str, str] | None = None) -> DistEnv:
    """Read RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT.

    LOCAL_RANK defaults to RANK and LOCAL_WORLD_SIZE to WORLD_SIZE (one node).

    Raises:
        ValueError: a required variable is missing, not an integer, or out of range.
    """
    environ = os.environ if environ is None else environ
    missing = [name for name in REQUIRED_VARIABLES if not environ.get(name)]
    if missing:
        raise ValueError(
            f"missing environment variable(s) {', '.join(missing)}: set them, or start the "
            "workers with clorch.distributed.launch, clorch-train or torchrun"
        )
    world_size = _int_var(environ, "WORLD_SIZE", 1)
    rank = _int_var(environ, "RANK", 0)
    if rank >= world_size:
        raise ValueError(f"environment variable RANK must be in [0, {world_size}), got {rank}")
    local_rank = _int_var(environ, "LOCAL_RANK", 0) if environ.get("LOCAL_RANK") else rank
    local_world_size = _int_var(environ, "LOCAL_WORLD_SIZE", 1) if environ.get("LOCAL_WORLD_SIZE") else world_size
    if local_rank >= local_world_size:
        raise ValueError(
            f"environment variable LOCAL_RANK must be in [0, {local_world_size}) (LOCAL_WORLD_SIZE), got {local_rank}"
        )
    port = _int_var(environ, "MASTER_PORT", 1)
    if port > 65535:
        raise ValueError(f"environment variable MASTER_PORT must be in [1, 65535], got {port}")
    return DistEnv(rank, world_size, local_rank, local_world_size, environ["MASTER_ADDR"], port)


# torch's C++ warnings (a TCPStore peer that went away at shutdown, with its C++ stack
# trace) reach the console of a run whose failures clorch reports itself; errors still show.
QUIET_CPP_LOGS = {"TORCH_CPP_LOG_LEVEL": "ERROR"}


def with_multicast_off(environ: Mapping[str, str]) -> dict[str, str]:
    """A copy of `environ` with NVLink multicast disabled where the user did not decide."""
    merged = dict(environ)
    for name, value in MULTICAST_OFF.items():
        merged.setdefault(name, value)
    return merged


def with_rank_defaults(environ: Mapping[str, str]) -> dict[str, str]:
    """A copy of `environ` for a rank clorch starts: multicast off and torch's C++ warnings
    quiet, each only where the user did not set the variable."""
    merged = with_multicast_off(environ)
    for name, value in QUIET_CPP_LOGS.items():
        merged.setdefault(name, value)
    return merged


RESTART_VARIABLES = ("CLORCH_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")


def restart_count(environ: Mapping[str, str] | None = None) -> int:
    """How many times a launcher restarted this job: clorch's (CLORCH_RESTART_COUNT) or
    torchrun's elastic agent (TORCHELASTIC_RESTART_COUNT); 0 on the first start."""
    environ = os.environ if environ is None else environ
    counts = []
    for name in RESTART_VARIABLES:
        try:
            counts.append(int(environ.get(name, "0") or 0))
        except ValueError:
            counts.append(0)
    return max(counts)


# torch's C++ log level, read once when torch is imported. See `quiet_cpp_warnings`.
CPP_LOG_VARIABLE = "TORCH_CPP_LOG_LEVEL"
_quieted: list[bool] = []  # whether this process set CPP_LOG_VARIABLE (not the user)


def quiet_cpp_warnings() -> None:
    """In the launching process, before torch is imported: torch's C++ warnings at level ERROR.

    When a job of several nodes ends, torch's agents tear down the rendezvous store that one of
    them hosts; an agent whose store call comes after the host has gone gets an error that
    torch also logs as a C++ warning with its whole stack trace (about 18 "frame #N" lines),
    although the job succeeded and nothing is wrong. The launching process runs no training,
    so it keeps only torch's C++ errors. A level the user set is kept, and the ranks get the
    user's environment back (`ranks_environ`).
    """
    if CPP_LOG_VARIABLE in os.environ or "torch" in sys.modules:
        return
    os.environ[CPP_LOG_VARIABLE] = "ERROR"
    _quieted.append(True)


def cpp_warnings_quieted() -> bool:
    """Whether `quiet_cpp_warnings` set the C++ log level in this process (not the user)."""
    return bool(_quieted)


def ranks_environ(env: dict[str, str]) -> dict[str, str]:
    """`env` (the launching process's) without the C++ log level `quiet_cpp_warnings` set."""
    if _quieted:
        env = {k: v for k, v in env.items() if k != CPP_LOG_VARIABLE}
    return env
