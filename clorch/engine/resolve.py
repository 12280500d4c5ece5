"""Turn a validated config into concrete settings: backend, ranks, devices, steps.

`resolve(cfg)` runs in the launching process before any rank starts. It adds
the errors that need the machine (nccl without GPUs, devices that do not
exist) or the data (a batch larger than a rank's shard) to the schema errors,
and raises them all together as one `ConfigError`.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from clorch.config.validate import ConfigError, check_config


@dataclass(frozen=True)
class Resolved:
    """What the auto settings became on this machine."""

    backend: str                 # "nccl" or "gloo"
    nproc_per_node: int          # ranks on this node
    devices: list[int] | None    # CUDA device indices, None for CPU ranks
    world_size: int              # ranks in the whole job
    device_type: str             # "cuda" or "cpu"
    train_size: int              # samples in the training split
    shard_size: int              # samples per rank per epoch
    steps_per_epoch: int         # optimizer steps per epoch
    total_steps: int             # optimizer steps in the run

    def describe(self, precision: str) -> str:
        """One line for the user: where and how the job runs."""
        where = (f"{self.nproc_per_node} CUDA rank(s) on devices {self.devices} over {self.backend}"
                 if self.device_type == "cuda"
                 else f"{self.nproc_per_node} CPU rank(s) over {self.backend} (no CUDA GPU visible)")
        amp = {"bf16": "bf16 autocast", "fp16": "fp16 autocast with loss scaling",
               "fp32": "fp32"}[precision]
        if self.device_type == "cpu" and precision != "fp32":
            amp = f"{precision} CPU autocast" + (" with loss scaling" if precision == "fp16" else "")
        nodes = f" x {self.world_size // self.nproc_per_node} nodes" if self.world_size > self.nproc_per_node else ""
        return (f"clorch: running {where}{nodes}, {amp}; "
                f"{self.total_steps} steps of {self.steps_per_epoch} per epoch")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ranks(launcher: Mapping[str, Any], backend: str, problems: list[str]) -> tuple[int, list[int] | None, str]:
    from clorch.launch.gpus import resolve_ranks

    nproc = launcher["nproc_per_node"]
    if nproc == "auto":
        nproc = None
    elif isinstance(nproc, str):
        problems.append(f"launcher.nproc_per_node must be 'auto' or an integer >= 1, got {nproc!r}")
        nproc = None
    devices = launcher.get("devices")
    before = len(problems)
    count, cuda, name = resolve_ranks(nproc, devices, backend, os.environ, problems)
    for i in range(before, len(problems)):  # the launcher names its arguments bare
        problems[i] = f"launcher.{problems[i]}" if problems[i].startswith(("devices", "nproc")) \
            else f"backend={backend}: {problems[i]}"
    if cuda is None:
        return count, None, name or "gloo"
    return count, devices if devices is not None else list(range(len(cuda))), name or "nccl"


def train_size(data: Mapping[str, Any], seed: int) -> int:
    """Samples in the training split (builds the task unless the count is in the config).

    Raises:
        ValueError, TypeError: the task rejects its arguments.
    """
    if data["name"] == "synthetic":
        return int(data["sample_count"])
    from clorch.data.tasks import build_task

    kwargs = {k: v for k, v in data.items() if k != "name"}
    return len(build_task(data["name"], split="train", seed=seed, **kwargs))


def plan_steps(cfg: Mapping[str, Any], size: int, world: int) -> tuple[int, int, int]:
    """(samples per rank per epoch, optimizer steps per epoch, steps in the run).

    A step takes batch_size * accumulation of the rank's samples; the epoch's last
    step takes what is left, so an epoch is ceil(shard / (batch_size * accumulation)) steps.
    """
    shard = size // world if cfg["sampler"]["drop_last"] else math.ceil(size / world)
    steps_per_epoch = max(1, math.ceil(shard / (cfg["batch_size"] * cfg["accumulation"])))
    return shard, steps_per_epoch, cfg["max_steps"] or cfg["epochs"] * steps_per_epoch


def _steps(cfg: Mapping[str, Any], size: int, world: int, problems: list[str]) -> tuple[int, int, int]:
    shard, steps_per_epoch, total = plan_steps(cfg, size, world)
    if cfg["batch_size"] > shard:
        problems.append(f"batch_size={cfg['batch_size']} is larger than a rank's shard: "
                        f"{size} training samples over {world} ranks give {shard} per rank "
                        f"(use batch_size <= {shard}, more data, or fewer ranks)")
    schedule = cfg["schedule"]
    if schedule["name"] == "cosine" and total <= schedule["warmup_steps"]:
        problems.append(f"schedule.warmup_steps={schedule['warmup_steps']} must be < the run's "
                        f"{total} optimizer steps for schedule=cosine")
    return shard, steps_per_epoch, total


def _resolve(cfg: DictConfig | Mapping[str, Any]) -> tuple[Resolved | None, list[str]]:
    problems = check_config(cfg)
    try:
        container = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
        nproc, devices, backend = _ranks(container["launcher"], container["backend"], problems)
        world = nproc * container["launcher"]["nnodes"]
        size = train_size(container["data"], container["seed"])
        shard, per_epoch, total = _steps(container, size, world, problems)
    except (ValueError, TypeError, OSError) as exc:
        if not problems:  # the task rejected its arguments
            problems.append(f"data={container['data']['name']}: {exc}")
        return None, problems
    except (KeyError, AttributeError, ArithmeticError):
        return None, problems  # a malformed section: check_config already said which
    if problems:
        return None, problems
    return Resolved(backend=backend, nproc_per_node=nproc, devices=devices, world_size=world,
                    device_type="cuda" if backend == "nccl" else "cpu", train_size=size,
                    shard_size=shard, steps_per_epoch=per_epoch, total_steps=total), []


def resolve_errors(cfg: DictConfig | Mapping[str, Any]) -> list[str]:
    """Every error `resolve` would raise (empty when the config runs here)."""
    return _resolve(cfg)[1]


def resolve(cfg: DictConfig | Mapping[str, Any]) -> Resolved:
    """Validate `cfg` and resolve its auto settings on this machine.

    Raises:
        ConfigError: every schema, machine and data error found, together.
    """
    resolved, problems = _resolve(cfg)
    if problems:
        raise ConfigError(problems)
    return resolved
