"""`ParallelLayout`: how the job's ranks are arranged, in one small object (standard library only).

The launch plan builds it once, from the `parallel` option and the world size
(`ParallelOption.layout(world_size)`), and everything that needs "how many replicas,
how many shards, which rank is where" asks it: the plan's checks (the data each rank
reads, the memory a rank holds, the checkpoint format a resume needs), the sampler,
evaluation, logging and checkpoints. Nothing else reads the `parallel` option's
`shards` flag, and nothing uses the world size where it means the data-parallel size.

The ranks form a `replicate x shard_size` grid (torch's 2-D device mesh, row-major:
rank r is in replica `r // shard_size`, at shard `r % shard_size`):

- `parallel=ddp`: `world_size` replicas of one rank each (every rank holds the whole model);
- `parallel=fsdp`: one replica sharded over every rank;
- `parallel=hsdp`: `replicate` replicas, each sharded over `world_size / replicate` ranks.

In each of them every rank is a data-parallel worker: it reads its own share of
the data (`dp_size` is the world size, `dp_rank(rank)` the rank), since the ranks of
a shard group split one replica's state, not its batch. A later mode that splits a
batch's work over several ranks (tensor or context parallel) reads one data shard per
group of ranks, and only this object changes.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ParallelLayout"]


@dataclass(frozen=True)
class ParallelLayout:
    """The job's ranks as `replicate` replicas of the model's state, each over `shard_size` ranks.

    Args:
        world_size: ranks in the job.
        replicate: replicas of the model's state (whole or sharded); divides `world_size`.
        sharded: each replica's state is split over its shard group's ranks (torch's
            fully_shard, sharded checkpoints), also on a shard group of one rank.

    Raises:
        ValueError: world_size or replicate < 1, or replicate does not divide world_size.
    """

    world_size: int  # ranks in the job
    replicate: int  # replicas of the model's state (whole or sharded)
    sharded: bool  # each replica's state is split over its ranks (fully_shard, sharded checkpoints)

    def __post_init__(self) -> None:
        for name in ("world_size", "replicate"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"ParallelLayout {name} must be an int >= 1, got {value!r}")
        if self.world_size % self.replicate:
            raise ValueError(f"ParallelLayout replicate={self.replicate} must divide world_size={self.world_size}")

    @classmethod
    def data_parallel(cls, world_size: int) -> ParallelLayout:
        """Every rank holds the whole model (parallel=ddp): `world_size` replicas of one rank."""
        return cls(world_size, world_size, sharded=False)

    @classmethod
    def fully_sharded(cls, world_size: int) -> ParallelLayout:
        """One replica sharded over every rank (parallel=fsdp)."""
        return cls(world_size, 1, sharded=True)

    @property
    def shard_size(self) -> int:
        """Ranks that share one replica's state: each holds 1/shard_size of it (1: the whole)."""
        return self.world_size // self.replicate

    @property
    def dp_size(self) -> int:
        """Data-parallel workers: ranks that each read their own share of the data (every rank)."""
        return self.world_size

    def dp_rank(self, rank: int) -> int:
        """Which share of the data `rank` reads, in [0, dp_size)."""
        self._check(rank)
        return rank

    def replica_of(self, rank: int) -> int:
        """The replica `rank` belongs to, in [0, replicate)."""
        self._check(rank)
        return rank // self.shard_size

    def shard_of(self, rank: int) -> int:
        """`rank`'s place in its replica's shard group, in [0, shard_size)."""
        self._check(rank)
        return rank % self.shard_size

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """The device mesh's shape: (replicate, shard_size) with both above one, else one dimension."""
        if self.replicate > 1 and self.shard_size > 1:
            return (self.replicate, self.shard_size)
        return (self.world_size,)

    def describe(self) -> str:
        """In words, for messages: "2 replicas x 2 shards"."""

        def count(n: int, word: str) -> str:
            return f"{n} {word}{'s' if n != 1 else ''}"

        if not self.sharded:
            return count(self.replicate, "replica") + " (whole model on every rank)"
        return f"{count(self.replicate, 'replica')} x {count(self.shard_size, 'shard')}"

    def _check(self, rank: int) -> None:
        if type(rank) is not int or not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be an int in [0, {self.world_size}), got {rank!r}")
