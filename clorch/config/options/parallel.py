"""The `parallel` group: whole model on every rank (ddp) or sharded (fsdp)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Union

from clorch.config.registry import Option, constant_of, declare, option, rule

declare("parallel", "data parallel (ddp) or sharded data parallel (fsdp)")


class ParallelOption(Option):
    """Any `parallel` option: how the model is placed on the ranks."""

    # "module:Class" of the mode's strategy (clorch.strategies.base.Strategy): what a rank's loop,
    # evaluation, checkpoints and export ask of the mode; built by `from_config` on every rank
    strategy: ClassVar[str] = ""
    shards: ClassVar[bool] = False  # each rank holds a shard of the state (sharded checkpoints, memory per rank)

    def float8_all_gather(self, precision: Any) -> bool:
        """Whether float8 layers all-gather their weights in float8 (a mode that shards them, when
        `precision=fp8` asks for it)."""
        return False


@option("parallel", "ddp")
@dataclass
class DDPParallelConfig(ParallelOption):
    """Data parallel: every rank holds the whole model; clorch's reducer (the `ddp` group's keys)."""

    name: Literal["ddp"] = "ddp"
    strategy: ClassVar[str] = "clorch.strategies.ddp:DDPStrategy"


@option("parallel", "fsdp")
@dataclass
class FSDPParallelConfig(ParallelOption):
    """Sharded data parallel (torch's fully_shard): each rank holds 1/world of the model's state.

    Parameters, gradients and optimizer state are split over the job's ranks
    (clorch.nn.parallel.fsdp); the `ddp` group's keys do not apply.
    """

    name: Literal["fsdp"] = "fsdp"
    strategy: ClassVar[str] = "clorch.strategies.fsdp:FSDPStrategy"
    shards: ClassVar[bool] = True
    # which modules get their own fully_shard: auto (those the model's shard_units() names, the
    # built-in GPT's blocks; else every child with >= min_params parameters) or class names, e.g. [Block]
    shard: Union[Literal["auto"], list[str]] = "auto"
    min_params: int = field(
        default=constant_of("clorch.nn.parallel.fsdp", "AUTO_MIN_PARAMS"), metadata=rule(ge=1)
    )  # shard=auto: parameters a child needs to be a unit of its own
    reshard_after_forward: bool = (
        True  # free each unit's gathered parameters after forward (less memory, one more all-gather)
    )
    # the dtype parameters are all-gathered and computed in: auto is the precision's (bf16 or fp16:
    # half the all-gather bytes, as torchtitan does); fp32 gathers them in fp32 and lets autocast
    # compute in the precision's dtype, as parallel=ddp does (ddp's numerics, twice the bytes)
    param_dtype: Literal["auto", "fp32"] = "auto"
    cpu_offload: bool = False  # keep the sharded parameters, gradients and optimizer state in CPU memory

    def float8_all_gather(self, precision: Any) -> bool:
        return bool(getattr(precision, "fsdp_float8_all_gather", False))

    def rules(self, cfg: Any) -> list[str]:
        """The `ddp` group's keys configure clorch's reducer, which a sharded run does not use."""
        if cfg.ddp is None:
            return []
        default = type(cfg.ddp)()
        return [
            f"ddp.{f.name}={getattr(cfg.ddp, f.name)!r} does nothing with parallel=fsdp (the ddp group "
            "configures clorch's reducer under parallel=ddp): drop it, or use parallel=ddp"
            for f in dataclasses.fields(cfg.ddp)
            if getattr(cfg.ddp, f.name) != getattr(default, f.name)
        ]
