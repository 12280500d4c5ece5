"""`ExactFSDPStrategy` (parallel=fsdp with exact=true): parallel=ddp's exact bits, sharded.

The model, its parameters and the optimizer's state are sharded as `FSDPStrategy`
shards them, and every bit of the result is `ExactDDPStrategy`'s, on any world size:

- the start: a built-in model draws its seeded values module by module on every rank
  (`clorch.nn.parallel.fsdp_init.materialize`), and a model of yours is built whole from
  the seed (`clorch.builders.rank_model`): the values parallel=ddp starts from;
- each micro-batch's backward runs without FSDP's reduce-scatter (`requires_gradient_sync`
  off) and leaves the parameters unsharded (`reshard_after_backward` off), so its whole
  gradient is read from the unsharded parameters as one leaf of the tree
  (`clorch.nn.parallel.exact.TreeGradients`), and the model is resharded;
- at the step's end the tree's sum (one all-gather of subtree sums, as under ddp) is the
  whole gradient on every rank: the norm for clipping is taken from it with the same calls
  as ddp's, and each rank keeps its rows of it as its shards' `.grad`;
- the optimizer step is elementwise: each element of a shard gets the bits ddp's whole
  parameter gets there.

The cost against parallel=fsdp: FSDP's gradient sharding is given up inside the step.
Each rank holds the whole gradient of each of its micro-batches (as parallel=ddp with
exact=true does), and each unit is gathered again for every micro-batch's forward.
Parameters and optimizer state stay sharded. Checkpoints are `FSDPStrategy`'s.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Replicate, Shard

from clorch.nn.parallel.exact import TreeGradients
from clorch.strategies.base import ModelSource, compile_mode_of
from clorch.strategies.exact import ExactSteps, deterministic_kernels, refuse_inexact_modules
from clorch.strategies.fsdp import FSDPStrategy

__all__ = ["ExactFSDPStrategy", "keep_gradients_unsharded", "reshard", "shard_of", "unsharded_parameters"]


def keep_gradients_unsharded(model: nn.Module) -> None:
    """Backward of a sharded `model` leaves each parameter unsharded with its gradient in
    `.grad`, unreduced: FSDP2's public switches, on every unit. Local."""
    if not isinstance(model, FSDPModule):
        raise TypeError(f"keep_gradients_unsharded takes a model sharded by fully_shard, got {type(model).__name__}")
    model.set_requires_gradient_sync(False)
    model.set_reshard_after_backward(False)


def unsharded_parameters(model: nn.Module) -> list[torch.Tensor]:
    """After a backward under `keep_gradients_unsharded`: the model's parameters, registered
    unsharded (plain tensors in their whole shapes), each holding its gradient. Local.

    A parameter still sharded belongs to a unit whose forward did not run in the micro-batch:
    it has no gradient, and zeros of its whole shape stand in for it, as parallel=ddp counts
    a parameter that got none. (That FSDP leaves every unit that ran unsharded, its gradient
    on the unsharded parameter, is what tests/nn/test_exact_tree.py checks of each torch.)
    """
    return [_whole_zeros(p) if isinstance(p, DTensor) else p for p in model.parameters()]


def _whole_zeros(shard: DTensor) -> torch.Tensor:
    device = shard.to_local().device
    return torch.zeros(shard.shape, dtype=shard.dtype, device=device, requires_grad=shard.requires_grad)


def reshard(model: nn.Module) -> None:
    """Register every unit's sharded parameters again and free the unsharded ones. Local."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def shard_of(whole: torch.Tensor, like: DTensor) -> DTensor:
    """This rank's rows of `whole` (a plain tensor in `like`'s global shape), as a DTensor
    placed as `like` is: a view of `whole`, not a copy. Local.

    FSDP2 shards dim 0 as `torch.chunk` splits it: rank r holds rows
    [r * c, (r + 1) * c) of n, c = ceil(n / world), clipped to n.

    Raises:
        ValueError: `like` is not sharded on dim 0 of a 1-D mesh, or its local shape is not
            those rows (FSDP shards otherwise than this assumes).
    """
    mesh = like.device_mesh
    if mesh.ndim != 1 or tuple(like.placements) != (Shard(0),):
        raise ValueError(f"shard_of expects a DTensor sharded on dim 0 of a 1-D mesh, got {like.placements}")
    rows, world = whole.shape[0], mesh.size()
    per = -(-rows // world)
    start = min(mesh.get_local_rank() * per, rows)
    local = whole[start : min(start + per, rows)]
    if local.shape != like.to_local().shape:
        raise ValueError(
            f"shard_of: rows [{start}, {start + local.shape[0]}) of {tuple(whole.shape)} are not this "
            f"rank's shard {tuple(like.to_local().shape)}"
        )
    return DTensor.from_local(local, mesh, like.placements, run_check=False, shape=like.shape, stride=like.stride())


class ExactFSDPStrategy(ExactSteps, FSDPStrategy):
    """parallel=fsdp, exact=true: sharded as `FSDPStrategy`, the step summed as `ExactDDPStrategy`.

    Args:
        parallel: the `parallel=fsdp` option, or any object with its keys.
        seed: the run's seed (the micro-batches' draws are keyed to it).
        compile_mode: torch.compile's mode for the sharded model's forward; False: not compiled.
    """

    def __init__(
        self,
        precision: Any,
        device: torch.device,
        rank: int = 0,
        world_size: int = 1,
        *,
        parallel: Any = None,
        seed: int = 0,
        compile_mode: Any = False,
    ):
        super().__init__(precision, device, rank, world_size, parallel=parallel, compile_mode=compile_mode)
        self.seed = seed
        self.tree: TreeGradients | None = None
        self._whole: list[torch.Tensor] | None = None  # the step's summed gradient, per parameter
        self._flat: torch.Tensor | None = None  # the same, one buffer that every shard's .grad views

    @classmethod
    def from_config(cls, cfg: Any, precision: Any, device: torch.device, rank: int, world_size: int) -> FSDPStrategy:
        return cls(
            precision, device, rank, world_size, parallel=cfg.parallel, seed=cfg.seed, compile_mode=compile_mode_of(cfg)
        )

    def setup(self, source: ModelSource, build_optimizer: Callable[[nn.Module], torch.optim.Optimizer]) -> None:
        """`FSDPStrategy.setup` (collective: fully_shard over the mesh), with deterministic kernels
        first and FSDP's gradient reduction off after."""
        deterministic_kernels(self.device)
        super().setup(source, build_optimizer)
        refuse_inexact_modules(self.raw_model)
        keep_gradients_unsharded(self.raw_model)
        self.tree = TreeGradients(self.raw_model.parameters(), self.rank, self.world_size, self.device)

    def after_backward(self, loss: torch.Tensor) -> None:
        """The micro-batch's whole gradient into the tree, then the model resharded. Local."""
        self.tree.add(loss, unsharded_parameters(self.raw_model))
        reshard(self.raw_model)

    def finish_gradients(self) -> torch.Tensor:
        """The tree's sum, whole on every rank; each shard's `.grad` views its rows of it. Returns
        the step's mean loss. Collective (see `TreeGradients.summed`)."""
        total = self.tree.summed()
        self._flat, self._whole = total[:-1], self.tree.views(total)
        for param, whole in zip(self.tree.params, self._whole):
            param.grad = shard_of(whole, param)
        return total[-1]

    def clip_gradients(self, max_norm: float | None) -> torch.Tensor | None:
        """Local: the norm is parallel=ddp's (`norm_and_clip`'s calls on the same whole gradients,
        on every rank), and each rank scales its shards by the same factor as ddp scales the whole.
        A loss scaler unscales the whole sum, which the shards view."""
        self.precision.unscale_gradients(self.optimizer, flats=[self._flat])
        if not self._whole:
            return None
        norm = torch.nn.utils.get_total_norm(self._whole, 2.0)
        if max_norm is not None:
            # The same torch call as ddp's; on shards, it takes the norm as a replicated DTensor.
            replicated = DTensor.from_local(norm, self.tree.params[0].device_mesh, [Replicate()], run_check=False)
            torch.nn.utils.clip_grads_with_norm_(self.tree.params, max_norm, replicated)
        return norm

    def optimizer_step(self) -> bool | torch.Tensor:
        """`FSDPStrategy.optimizer_step`; then the step's summed gradient is let go."""
        stepped = super().optimizer_step()
        self._flat = self._whole = None
        return stepped
