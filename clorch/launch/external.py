"""Is this process one rank of a job another launcher started? torchrun, srun, submitit.

Under torchrun (its elastic agent sets RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and TORCHELASTIC_RUN_ID), under
`srun --ntasks-per-node G` (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
SLURM_JOB_NODELIST, SLURM_STEP_ID; more tasks than nodes) and inside a
submitit job with more tasks than nodes (SUBMITIT_EXECUTOR; SLURM's variables,
or `submitit.JobEnvironment` for submitit's local executor), `clorch-train`
trains as that one rank and spawns nothing. With one task per node, clorch's
own launcher runs on each node instead (see clorch.launch.slurm).

This module is torch-free: the command line reads it before anything else.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping

from clorch.env import DistEnv, read_env
from clorch.launch.slurm import first_host, port_for_job


@dataclass(frozen=True)
class ExternalRank:
    """This process's place in a job started by another launcher."""

    launcher: str  # "torchrun", "slurm" or "submitit"
    run_id: str  # the same on every rank of the job: it names the run directory
    env: DistEnv  # rank, world size, local rank, master address and port

    @property
    def run_name(self) -> str:
        """A directory name every rank computes alike, e.g. "torchrun-job42" or "slurm-1234.0"."""
        return f"{self.launcher}-{re.sub(r'[^A-Za-z0-9_.-]', '_', self.run_id)}"


def _torchrun(environ: Mapping[str, str]) -> ExternalRank | None:
    if not environ.get("TORCHELASTIC_RUN_ID") or not environ.get("RANK"):
        return None
    env = read_env(environ)
    run_id = environ["TORCHELASTIC_RUN_ID"]
    if run_id == "none":  # torchrun's default --rdzv-id: name the run after its endpoint
        run_id = f"port{env.master_port}"
    return ExternalRank("torchrun", run_id, env)


def slurm_rank_environ(environ: Mapping[str, str]) -> dict[str, str] | None:
    """RANK, WORLD_SIZE, ... for one task of an srun step with several tasks per node, else None.

    Raises:
        ValueError: a SLURM variable is malformed.
    """
    needed = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID", "SLURM_JOB_ID")
    if not all(environ.get(name) for name in needed):
        return None
    try:
        tasks, nodes = int(environ["SLURM_NTASKS"]), int(environ.get("SLURM_NNODES", "1") or 1)
    except ValueError:
        raise ValueError(
            "environment variables SLURM_NTASKS and SLURM_NNODES must be integers, "
            f"got {environ.get('SLURM_NTASKS')!r} and {environ.get('SLURM_NNODES')!r}"
        ) from None
    if tasks <= nodes:  # one task per node: clorch's launcher runs on each node
        return None
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or ""
    per_node = re.match(r"\d+", environ.get("SLURM_NTASKS_PER_NODE", "") or "")
    return {
        "RANK": environ["SLURM_PROCID"],
        "WORLD_SIZE": str(tasks),
        "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"),
        "LOCAL_WORLD_SIZE": per_node.group(0) if per_node else str(tasks // nodes),
        "MASTER_ADDR": environ.get("MASTER_ADDR") or first_host(nodelist),
        "MASTER_PORT": environ.get("MASTER_PORT") or str(port_for_job(environ["SLURM_JOB_ID"])),
    }


def _slurm(environ: Mapping[str, str]) -> ExternalRank | None:
    variables = slurm_rank_environ(environ)
    if variables is None:
        return None
    launcher = "submitit" if environ.get("SUBMITIT_EXECUTOR") else "slurm"
    run_id = f"{environ['SLURM_JOB_ID']}.{environ['SLURM_STEP_ID']}"
    return ExternalRank(launcher, run_id, read_env(variables))


def _submitit_local(environ: Mapping[str, str]) -> ExternalRank | None:
    """A task of a job of submitit's local executor (hydra/launcher=submitit_local)."""
    if environ.get("SUBMITIT_EXECUTOR") != "local":
        return None
    import submitit  # lazy: submitit is optional (clorch[slurm]); installed wherever a submitit job runs

    job = submitit.JobEnvironment()
    if job.num_tasks <= job.num_nodes:  # one task per node: clorch's launcher runs the ranks
        return None
    port = environ.get("MASTER_PORT") or str(port_for_job(str(job.job_id)))
    variables = {
        "RANK": str(job.global_rank),
        "WORLD_SIZE": str(job.num_tasks),
        "LOCAL_RANK": str(job.local_rank),
        "LOCAL_WORLD_SIZE": str(job.num_tasks // job.num_nodes),
        "MASTER_ADDR": environ.get("MASTER_ADDR") or "127.0.0.1",
        "MASTER_PORT": port,
    }
    return ExternalRank("submitit", f"local{job.job_id}", read_env(variables))


def detect(environ: Mapping[str, str] | None = None) -> ExternalRank | None:
    """The external launcher this process runs under, or None (clorch launches the ranks).

    Raises:
        ValueError: the launcher's variables are malformed (named in the message).
    """
    environ = os.environ if environ is None else environ
    return _torchrun(environ) or _slurm(environ) or _submitit_local(environ)


def rank_environ(rank: ExternalRank) -> dict[str, str]:
    """The standard variables for `clorch.distributed.init_process_group` (SLURM's become them)."""
    e = rank.env
    return {
        "RANK": str(e.rank),
        "WORLD_SIZE": str(e.world_size),
        "LOCAL_RANK": str(e.local_rank),
        "LOCAL_WORLD_SIZE": str(e.local_world_size),
        "MASTER_ADDR": e.master_addr,
        "MASTER_PORT": str(e.master_port),
    }
