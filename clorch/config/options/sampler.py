"""The `sampler` group: how each rank draws its shard of the data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from clorch.config.registry import Option, declare, default_of, option

SAMPLER = "clorch.data.sampler:DistributedSampler"

declare("sampler", "each rank's shard of the data")


@option("sampler", "distributed")
@dataclass
class SamplerConfig(Option):
    """clorch.data.DistributedSampler: a disjoint, deterministic shard per rank."""

    name: Literal["distributed"] = "distributed"
    seed: Optional[int] = None  # shuffling seed; null uses the top-level seed
    shuffle: bool = default_of(SAMPLER, "shuffle")  # a new permutation each epoch (set_epoch)
    drop_last: bool = default_of(SAMPLER, "drop_last")  # drop the tail instead of padding every rank to equal length
