"""`HSDPStrategy` (parallel=hsdp): hybrid sharding, replicas of the model each sharded over a group of ranks.

torch's fully_shard on a 2-D device mesh `(replicate, shard)` (the job's
`ParallelLayout`: `parallel.replicate` replicas over `world_size / replicate` ranks
each, rank r in replica r // shard_size). Within a shard group, parameters are
all-gathered in forward and backward and gradients reduce-scattered, as under
parallel=fsdp; the gradient shards are then all-reduced across the replicas, so
every replica steps with the job's whole gradient. On a multi-node job with one
replica a node, the all-gathers stay on the node's links and only the gradient
all-reduce crosses nodes.

Everything else is `FSDPStrategy`'s: building on the meta device, clipping (the
partial norms reduced over both mesh dimensions), the optimizer step through the
precision object, sharded checkpoints (DCP saves each shard once, from the first
replica holding it, and reshards on load: a checkpoint of parallel=hsdp resumes
under parallel=fsdp and on another world size, and the other way round), export
and the digest.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from clorch.strategies.fsdp import FSDPStrategy

MESH_DIMS = ("replicate", "shard")  # the mesh's dimension names, torch's HSDP convention


class HSDPStrategy(FSDPStrategy):
    """parallel=hsdp, configured by the option's keys (`clorch.config.options.parallel.HSDPParallelConfig`)."""

    def device_mesh(self) -> DeviceMesh:
        """The `(replicate, shard)` mesh of the job's layout. Collective: every rank calls it."""
        layout = self.parallel.layout(self.world_size)
        return init_device_mesh(self.device.type, (layout.replicate, layout.shard_size), mesh_dim_names=MESH_DIMS)
