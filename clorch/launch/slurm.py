"""Node layout from SLURM's environment: SLURM_NNODES, SLURM_NODEID, SLURM_JOB_NODELIST.

Run one launcher per node (`srun --ntasks-per-node=1 python train.py`); each
reads its node's place here, so every node agrees on nnodes, the master node
(the first host of the node list) and the port (derived from SLURM_JOB_ID)
without talking to the others.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

PORT_BASE = 10000
PORT_SPAN = 50000  # ports 10000..59999, below Linux's default ephemeral range end


@dataclass(frozen=True)
class SlurmLayout:
    """What SLURM says about this node's place in the job."""

    nnodes: int
    node_rank: int
    master_addr: str | None
    master_port: int | None


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: "gpu[07-09,12],cpu1" -> "gpu07".

    Raises:
        ValueError: the list is empty or malformed.
    """
    text = nodelist.strip()
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", text)
    if not text or match is None:
        raise ValueError(f"environment variable SLURM_JOB_NODELIST is malformed, got {nodelist!r}")
    prefix, ranges = match.group(1), match.group(2)
    if ranges is None:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def _int(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {environ[name]!r}") from None


def port_for_job(job_id: str) -> int:
    """A port every node of SLURM job `job_id` computes alike: 10000 + job_id % 50000."""
    digits = re.sub(r"\D", "", job_id) or "0"
    return PORT_BASE + int(digits) % PORT_SPAN


def read_slurm(environ: Mapping[str, str]) -> SlurmLayout | None:
    """The layout SLURM describes, or None outside a SLURM allocation (no SLURM_NNODES).

    Raises:
        ValueError: a SLURM variable is malformed.
    """
    if not environ.get("SLURM_NNODES"):
        return None
    nnodes = _int(environ, "SLURM_NNODES")
    node_rank = _int(environ, "SLURM_NODEID") if environ.get("SLURM_NODEID") else 0
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    master_addr = first_host(nodelist) if nodelist else None
    job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    return SlurmLayout(nnodes, node_rank, master_addr, port_for_job(job_id) if job_id else None)


def layout_taken(nnodes: object, node_rank: object, environ: Mapping[str, str]) -> SlurmLayout | None:
    """The SLURM layout clorch's launcher takes: SLURM's, where the job's own layout was left at
    its defaults (`nnodes=1`, `node_rank=0`) inside a SLURM allocation; else None.

    Raises:
        ValueError: a SLURM variable is malformed.
    """
    return read_slurm(environ) if nnodes == 1 and node_rank == 0 else None
