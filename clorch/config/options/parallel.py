"""The `parallel` group: whole model on every rank (ddp), sharded over every rank (fsdp), or
replicas each sharded over a group of ranks (hsdp)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Union

from clorch.config.layout import ParallelLayout
from clorch.config.registry import Option, constant_of, declare, option, rule

declare("parallel", "data parallel (ddp), sharded data parallel (fsdp) or hybrid sharded (hsdp)")


class ParallelOption(Option):
    """Any `parallel` option: how the model is placed on the ranks."""

    # "module:Class" of the mode's strategy (clorch.strategies.base.Strategy): what a rank's loop,
    # evaluation, checkpoints and export ask of the mode; built by `from_config` on every rank
    strategy: ClassVar[str] = ""
    # each rank holds a shard of the state (sharded checkpoints, memory per rank): read through
    # `layout()`, which the plan builds once and every other part asks
    shards: ClassVar[bool] = False

    def layout(self, world_size: int) -> ParallelLayout:
        """How this mode arranges `world_size` ranks: replicas of the whole model (ddp's, one a
        rank), or one replica sharded over every rank where the mode `shards`."""
        if self.shards:
            return ParallelLayout.fully_sharded(world_size)
        return ParallelLayout.data_parallel(world_size)

    def layout_errors(self, world_size: int) -> list[str]:
        """Why this mode cannot arrange `world_size` ranks (each error names the key and the fix);
        none by default. The plan asks before it builds `layout(world_size)`."""
        return []

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
            f"ddp.{f.name}={getattr(cfg.ddp, f.name)!r} does nothing with parallel={self.name} (the ddp group "
            "configures clorch's reducer under parallel=ddp): drop it, or use parallel=ddp"
            for f in dataclasses.fields(cfg.ddp)
            if getattr(cfg.ddp, f.name) != getattr(default, f.name)
        ]


@option("parallel", "hsdp")
@dataclass
class HSDPParallelConfig(FSDPParallelConfig):
    """Hybrid sharding: `replicate` replicas of the model, each sharded over world_size / replicate ranks.

    torch's fully_shard on a 2-D device mesh (replicate, shard): parameters are all-gathered
    and gradients reduce-scattered within a shard group (one node, say), then the gradient
    shards are all-reduced across the replicas. Every rank reads its own data, as under ddp
    and fsdp. The fsdp option's keys apply to each shard group.
    """

    name: Literal["hsdp"] = "hsdp"
    strategy: ClassVar[str] = "clorch.strategies.hsdp:HSDPStrategy"
    # replicas of the model's state; each is sharded over world_size / replicate ranks (e.g. the
    # number of nodes, so that the all-gathers stay inside a node). Divides the world size; 2 or more
    replicate: int = 2

    def layout(self, world_size: int) -> ParallelLayout:
        return ParallelLayout(world_size, self.replicate, sharded=True)

    def layout_errors(self, world_size: int) -> list[str]:
        """A replicate degree that leaves no shard group of two or more ranks, or does not divide the ranks."""
        key = f"parallel.replicate={self.replicate}"
        if self.replicate <= 1:
            return []  # `rules` says it, with no world size needed
        if world_size % self.replicate:
            fits = [r for r in range(2, world_size) if world_size % r == 0]
            hint = (
                f"use parallel.replicate={' or '.join(map(str, fits))}"
                if fits
                else f"no replicate degree splits {world_size} ranks into groups of 2 or more: "
                "use parallel=fsdp or parallel=ddp"
            )
            return [f"{key} must divide the job's {world_size} ranks into equal shard groups: {hint}"]
        if self.replicate == world_size:
            return [
                f"{key} leaves one rank per shard group on the job's {world_size} ranks (nothing is sharded): "
                "that is parallel=ddp; use it, or a parallel.replicate that leaves 2 or more ranks a group"
            ]
        return []

    def rules(self, cfg: Any) -> list[str]:
        errors = super().rules(cfg)
        if self.replicate < 1:
            errors.append(f"parallel.replicate must be >= 2, got {self.replicate}")
        elif self.replicate == 1:
            errors.append(
                "parallel.replicate=1 is one replica sharded over every rank: that is parallel=fsdp; "
                "use it, or parallel.replicate >= 2"
            )
        return errors
