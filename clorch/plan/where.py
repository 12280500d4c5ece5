"""Where the job's ranks run, an input to the launch plan: its hardware is checked there.

The plan checks what a job needs of its machine (CUDA GPUs for backend=nccl, their compute
capability for precision=fp8, their memory, the cores for CPU ranks, the packages an option
imports, the directories it writes) against the machine its ranks will run on, which is not
always the one clorch-train runs on:

`Machine.here()`   this machine: clorch's own launcher, `clorch.run_local`, a sweep's trials
                   on this machine, and each rank of torchrun, srun or submitit, which composes
                   and checks the config on its own node (clorch.engine.as_rank). Everything
                   is checked, read here (CUDA_VISIBLE_DEVICES or /dev/nvidiaN, nvidia-smi,
                   /proc/meminfo).
`job_machine(...)` the nodes a sweep's Hydra launcher plugin submits its jobs to
                   (hydra/launcher=submitit_slurm): their GPUs are the ones the launcher asks
                   for (hydra.launcher.gpus_per_node, gpus_per_task, gres), their ranks its
                   tasks (hydra.launcher.tasks_per_node; one task a node runs clorch's launcher
                   there), their count hydra.launcher.nodes. Nothing of this machine's hardware
                   is read: the compute capability, the memory and the cores are checked by the
                   ranks on their nodes. The packages and directories are this machine's
                   (submitit runs this Python, and the jobs write the sweep directory).
                   hydra/launcher=submitit_local runs the jobs here, on as many of this
                   machine's GPUs as it asks for.
`ANYWHERE`         `--cfg job`: the config as a config, for whichever machine it is meant for;
                   nothing a machine has or lacks is checked.

Every config error is still reported before anything is submitted.
This module is torch-free: the command line reads it before anything else.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from clorch.launch.gpus import visible_gpus

HERE = "this machine"


@dataclass(frozen=True)
class Machine:
    """What the plan knows of the machine the job's ranks run on (one node of it)."""

    where: str  # the machine, in messages: "this machine", "each node hydra/launcher=... asks for (...)"
    gpus: tuple[str, ...] | None  # a node's CUDA devices (CUDA_VISIBLE_DEVICES entries); None: not known
    hardware_here: bool  # its compute capability, memory and cores are this machine's (read here)
    software_here: bool  # its packages and filesystem are this machine's
    tasks_per_node: int = 1  # ranks a launcher plugin starts on each node (1: clorch's launcher starts them)
    nodes: int | None = None  # nodes a launcher plugin asks for; None: the config's launcher.nnodes
    problems: tuple[str, ...] = ()  # why no job can be sent to it from here (reported with the config's errors)

    @classmethod
    def here(cls, environ: Mapping[str, str] | None = None) -> "Machine":
        """This machine, as its environment shows it now."""
        return cls(HERE, tuple(visible_gpus(os.environ if environ is None else environ)), True, True)

    @property
    def is_here(self) -> bool:
        """Whether the ranks run on this machine, with the GPUs it shows (a plan made for it runs here)."""
        return self.where == HERE

    def environ(self, nproc: int | None, devices: Sequence[int] | None) -> dict[str, str]:
        """CUDA_VISIBLE_DEVICES as a node of this machine shows it to clorch's launcher. Not known
        (`ANYWHERE`): as many GPUs as the config's ranks or devices ask for."""
        gpus = self.gpus
        if gpus is None:
            wanted = max(
                [nproc if isinstance(nproc, int) else 1, *[d + 1 for d in devices or () if isinstance(d, int)]]
            )
            gpus = tuple(str(i) for i in range(max(1, wanted)))
        return {"CUDA_VISIBLE_DEVICES": ",".join(gpus)}

    def phrase(self, text: str) -> str:
        """A message of clorch's launcher (which speaks of "this machine") about this one."""
        return text if self.is_here else text.replace(HERE, self.where)


ANYWHERE = Machine("the machine the config is for", None, False, False)


def job_machine(overrides: Sequence[str], environ: Mapping[str, str] | None = None) -> Machine:
    """The machine a sweep's jobs run on, from its command line: the nodes of the Hydra launcher
    plugin it names (`hydra/launcher=submitit_slurm` and its `hydra.launcher.*` keys), else this
    machine (`hydra/launcher=basic`, the default)."""
    choices = [a.partition("=")[2] for a in overrides if a.partition("=")[0].lstrip("+") == "hydra/launcher"]
    plugin = choices[-1] if choices else "basic"
    if plugin not in ("submitit_slurm", "submitit_local"):
        return Machine.here(environ)
    keys = {}
    for arg in overrides:
        key, _, value = arg.partition("=")
        if key.lstrip("+").startswith("hydra.launcher."):
            keys[key.lstrip("+").removeprefix("hydra.launcher.")] = value
    problems: list[str] = []
    tasks = _count(keys, "tasks_per_node", 1, problems) or 1
    nodes = _count(keys, "nodes", 1, problems) or 1
    gpus, named = _declared_gpus(keys, tasks, problems)
    if plugin == "submitit_local":
        return _local_machine(gpus, named, tasks, problems, environ)
    path = (os.environ if environ is None else environ).get("PATH")
    missing = [command for command in ("sbatch", "srun") if shutil.which(command, path=path) is None]
    if missing:
        problems.append(
            f"hydra/launcher=submitit_slurm submits through SLURM's sbatch and srun, but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not on this machine's PATH: run clorch-train on a SLURM "
            "login node (or load SLURM's module), or use hydra/launcher=submitit_local"
        )
    return Machine(
        f"each node hydra/launcher=submitit_slurm asks for ({named})",
        tuple(str(i) for i in range(gpus)),
        hardware_here=False,
        software_here=True,
        tasks_per_node=tasks,
        nodes=nodes,
        problems=tuple(problems),
    )


def _local_machine(
    gpus: int, named: str, tasks: int, problems: list[str], environ: Mapping[str, str] | None
) -> Machine:
    """This machine as hydra/launcher=submitit_local gives a job its first `gpus` GPUs."""
    here = Machine.here(environ)
    if gpus > len(here.gpus or ()):
        problems.append(
            f"{named} asks for {gpus} GPU(s), but {HERE} shows {len(here.gpus or ())} and "
            "hydra/launcher=submitit_local runs its jobs here: ask for fewer"
        )
    where = f"{HERE} (hydra/launcher=submitit_local gives a job {named})"
    return replace(here, where=where, gpus=(here.gpus or ())[:gpus], tasks_per_node=tasks, problems=tuple(problems))


def _count(keys: Mapping[str, str], name: str, default: int, problems: list[str]) -> int | None:
    """`hydra.launcher.<name>` as an int >= 0 (`default` when not given), or None (reported)."""
    value = keys.get(name)
    if value is None or value in ("null", "None", ""):
        return default if value is None else 0
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        problems.append(f"hydra.launcher.{name} must be an integer >= 0, got {value!r}")
        return None
    return number


def _declared_gpus(keys: Mapping[str, str], tasks: int, problems: list[str]) -> tuple[int, str]:
    """(the GPUs a node gets, the keys that say so, as `key=value`): gpus_per_node, else
    gpus_per_task x tasks_per_node, else a `gres` of gpu[:type]:N; none of them: 0."""
    if keys.get("gpus_per_node") not in (None, "null"):
        return _count(keys, "gpus_per_node", 0, problems) or 0, f"hydra.launcher.gpus_per_node={keys['gpus_per_node']}"
    if keys.get("gpus_per_task") not in (None, "null"):
        each = _count(keys, "gpus_per_task", 0, problems) or 0
        return each * tasks, f"hydra.launcher.gpus_per_task={keys['gpus_per_task']} x {tasks} task(s)"
    for item in (keys.get("gres") or "").split(","):
        parts = item.strip().split(":")  # gpu, gpu:N, gpu:TYPE:N
        if parts[0] == "gpu":
            count = int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
            return count, f"hydra.launcher.gres={keys['gres']}"
    return 0, "hydra.launcher.gpus_per_node is not set: set it to ask for GPUs"
