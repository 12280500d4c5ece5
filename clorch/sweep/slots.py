"""Which devices each of a sweep's side-by-side trials gets: GPUs on a GPU machine, cores on CPU.

`n_jobs` trials run at once, each on a slot of its own: GPUs through
CUDA_VISIBLE_DEVICES (so a trial of 2 ranks sees exactly its 2 GPUs), cores
through the CPU affinity its processes inherit (and OMP_NUM_THREADS), so that
two trials never share a device or a core. Inside a SLURM allocation the
machine is what the allocation gave this process (its CUDA_VISIBLE_DEVICES and
CPU affinity), so a sweep packs its trials onto that allocation.
Standard library only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from clorch.launch.gpus import visible_gpus

ALONE_CPU_RANKS = 2  # clorch's own `auto` without GPUs (clorch.launch.gpus.resolve_ranks)


@dataclass(frozen=True)
class Slot:
    """What one running trial may use."""

    index: int
    gpus: tuple[str, ...]  # CUDA_VISIBLE_DEVICES entries; empty on CPU
    cores: tuple[int, ...]  # CPU cores (the trial's affinity)
    ranks: int  # the trial's ranks on this node
    alone: int = ALONE_CPU_RANKS  # the ranks `auto` gives a run alone on this machine (alone_ranks)

    def environ(self) -> dict[str, str]:
        """The environment a trial on this slot starts with (over the sweep's own)."""
        threads = max(1, len(self.cores) // max(1, self.ranks))
        env = {"OMP_NUM_THREADS": str(threads)}
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)
        return env

    def describe(self) -> str:
        if self.gpus:
            return f"GPU {','.join(self.gpus)}"
        return f"core{'s' if len(self.cores) > 1 else ''} {','.join(map(str, self.cores))}"


def machine(environ: Mapping[str, str] | None = None) -> tuple[list[str], list[int]]:
    """(the GPUs, the CPU cores) this process may use."""
    environ = os.environ if environ is None else environ
    return visible_gpus(environ), sorted(os.sched_getaffinity(0))


def alone_ranks(gpus: list[str] | tuple[str, ...]) -> int:
    """The ranks `launcher.nproc_per_node=auto` gives a run alone on this machine: one per GPU,
    or 2 CPU ranks."""
    return len(gpus) if gpus else ALONE_CPU_RANKS


def ranks_per_trial(nproc: Any, n_jobs: int, gpus: list[str], cores: list[int], per_gpu: int = 1) -> int:
    """A trial's ranks: `launcher.nproc_per_node` when it is a number; `auto` shares the
    machine's GPUs (or, without GPUs, its cores) between the `n_jobs` trials, never giving a
    trial more ranks than a run alone has, and always a divisor of those: a trial with fewer
    ranks keeps a lone run's global batch by accumulating (`clorch.sweep.pool.sized_to_slot`),
    so that its result does not depend on how many trials run beside it. With `per_gpu` trials a
    GPU (hydra.sweeper.trials_per_gpu), each GPU counts that many times."""
    if isinstance(nproc, int) and not isinstance(nproc, bool):
        return nproc
    alone = alone_ranks(gpus)
    share = max(1, (len(gpus) * per_gpu if gpus else len(cores)) // n_jobs)
    return max(r for r in range(1, min(alone, share) + 1) if alone % r == 0)


_FEWER = (
    "lower n_jobs, or give each trial fewer ranks with launcher.nproc_per_node (and keep the global batch, "
    "batch_size x ranks x accumulation, by raising accumulation as much)"
)


def plan_slots(n_jobs: int, ranks: int, gpus: list[str], cores: list[int], per_gpu: int = 1) -> list[Slot]:
    """`n_jobs` slots of `ranks` ranks each, on disjoint cores, and on GPUs each shared by at most
    `per_gpu` trials (hydra.sweeper.trials_per_gpu; 1: disjoint GPUs). A trial's ranks are on
    distinct GPUs; trials sharing GPUs are spread over them (slot i on the GPUs after slot i-1's).

    Raises:
        ValueError: the machine cannot hold that many trials at once (the message names what
            was asked for and what the machine has).
    """
    if gpus:
        if n_jobs * ranks > len(gpus) * per_gpu or ranks > len(gpus):
            shared = f" with hydra.sweeper.trials_per_gpu={per_gpu}" if per_gpu > 1 else ""
            raise ValueError(
                f"hydra.sweeper.n_jobs={n_jobs} trials of {ranks} rank(s) need {n_jobs * ranks} GPUs at once{shared}; "
                f"this machine has {len(gpus)} (CUDA_VISIBLE_DEVICES={','.join(gpus)}): {_FEWER}"
            )
        places = gpus * per_gpu  # each GPU per_gpu times: a slot's ranks take consecutive places
        per_cores = max(1, len(cores) // n_jobs)
        return [
            Slot(i, tuple(places[i * ranks : (i + 1) * ranks]), _share(cores, i, per_cores), ranks, len(gpus))
            for i in range(n_jobs)
        ]
    if n_jobs * ranks > len(cores):
        raise ValueError(
            f"hydra.sweeper.n_jobs={n_jobs} trials of {ranks} CPU rank(s) need {n_jobs * ranks} cores at once "
            f"(one a rank); this machine has {len(cores)} (cores {','.join(map(str, cores))}): {_FEWER}"
        )
    per = len(cores) // n_jobs
    return [Slot(i, (), tuple(cores[i * per : (i + 1) * per]), ranks) for i in range(n_jobs)]


def _share(cores: list[int], i: int, per: int) -> tuple[int, ...]:
    share = tuple(cores[i * per : (i + 1) * per])
    return share or tuple(cores)  # fewer cores than trials on a GPU machine: they share the host
