"""`ExactDDPStrategy` (parallel=ddp with exact=true): the same bits on any world size.

The whole model on every rank, as `DDPStrategy`, but no rank's result depends on
how many ranks there are or which one trained what:

- the data: micro-batch j of a step is the same samples on any world size
  (the sampler's `block_size`; clorch.train.components);
- the draws: before micro-batch j of step s, torch's generators are seeded from
  (seed, s, j) (`micro_batch_seed`), so dropout draws the same mask wherever j runs;
- the loss: each micro-batch's loss is divided by the step's micro-batch count
  over all ranks, so its gradient is the same wherever it is computed;
- the sum: the micro-batches' gradients (and losses) are added in one fixed tree
  (`clorch.nn.parallel.exact.TreeGradients`), not by the backend's all-reduce;
- the kernels: on CPU each rank computes with one thread, since a CPU matrix product
  splits its sums by thread (2 threads and 1 give other bits); on CUDA,
  `torch.use_deterministic_algorithms(True)` with a fixed cuBLAS workspace, and every
  rank runs the same micro-batch shapes;
- clipping and the optimizer step then run on identical gradients on every rank.

Checkpoints are `DDPStrategy`'s files. What this cannot make exact is refused
before launch (clorch.config.checks and the plan's checks): BatchNorm's running
statistics, an optimizer stepped in backward. `ExactSteps` is what both exact
strategies do around each micro-batch; the sharded one is
`clorch.strategies.exact_fsdp.ExactFSDPStrategy`.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator

import torch
from torch import nn

import clorch.distributed as cdist
from clorch.nn.parallel.exact import TreeGradients, micro_batch_seed
from clorch.nn.parallel.grad_norm import norm_and_clip
from clorch.strategies.base import ModelSource, compile_mode_of, compiled
from clorch.strategies.ddp import DDPStrategy


def refuse_inexact_modules(model: nn.Module) -> None:
    """Raise for a module whose state depends on which rank saw which data.

    Raises:
        ValueError: a BatchNorm layer (its running statistics are updated by each rank's own
            micro-batches, so they differ by world size), named with the fix.
    """
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._NormBase) and module.track_running_stats:
            raise ValueError(
                f"exact=true cannot make {type(module).__name__} {name or '(the model)'} exact: its running "
                "statistics are updated by each rank's own micro-batches, so they depend on the world "
                "size; use LayerNorm or GroupNorm, track_running_stats=False, or exact=false"
            )


def deterministic_kernels(device: torch.device) -> None:
    """Kernels whose bits depend on the data alone. Local; once per rank, before the first kernel."""
    if device.type == "cpu":
        # CPU kernels split their sums by thread: one thread a rank, on any world size.
        torch.set_num_threads(1)
    else:
        # cuBLAS picks reduction splits by workspace; a fixed workspace makes them repeat
        # (PyTorch's reproducibility notes), and deterministic algorithms refuse atomics.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False


class ExactSteps:
    """What exact=true does around each micro-batch, whatever places the model on the ranks.

    Mixed in before a strategy class (`ExactDDPStrategy`, `ExactFSDPStrategy`), which sets
    `seed`, `rank` and `world_size` and sums the step in `finish_gradients`.
    """

    loss_is_global = True
    seed: int
    rank: int
    world_size: int

    def loss_divisor(self, count: int) -> int:
        """Every micro-batch's loss is divided by the step's micro-batches on all ranks."""
        return count * self.world_size

    @contextlib.contextmanager
    def micro_batch(self, index: int, count: int, step: int) -> Iterator[None]:
        """Seed the draws from the micro-batch's place in the run; no communication in backward."""
        torch.manual_seed(micro_batch_seed(self.seed, step, self.rank * count + index))
        yield


class ExactDDPStrategy(ExactSteps, DDPStrategy):
    """parallel=ddp, exact=true: whole model on every rank, gradients summed in a fixed tree.

    Args:
        seed: the run's seed (the micro-batches' draws are keyed to it).
        compile_mode: torch.compile's mode for the model; False: not compiled.
    """

    def __init__(
        self,
        precision: Any,
        device: torch.device,
        rank: int = 0,
        world_size: int = 1,
        *,
        seed: int = 0,
        compile_mode: Any = False,
    ):
        super().__init__(precision, device, rank, world_size, compile_mode=compile_mode)
        self.seed = seed
        self.tree: TreeGradients | None = None

    @classmethod
    def from_config(cls, cfg: Any, precision: Any, device: torch.device, rank: int, world_size: int) -> DDPStrategy:
        return cls(precision, device, rank, world_size, seed=cfg.seed, compile_mode=compile_mode_of(cfg))

    def setup(self, source: ModelSource, build_optimizer: Callable[[nn.Module], torch.optim.Optimizer]) -> None:
        """Build the whole model and start every rank from rank 0's weights (collective: one
        broadcast per tensor where world_size > 1), then the optimizer over it."""
        deterministic_kernels(self.device)
        raw = source.whole().to(self.device)
        refuse_inexact_modules(raw)
        if self.world_size > 1:
            with torch.no_grad():
                for tensor in [*raw.parameters(), *raw.buffers()]:
                    cdist.broadcast(tensor.data, src=0)
        self.raw_model, self.model = raw, compiled(raw, self.compile_mode)
        self.optimizer = build_optimizer(raw)
        self.tree = TreeGradients(raw.parameters(), self.rank, self.world_size, self.device)

    def after_backward(self, loss: torch.Tensor) -> None:
        self.tree.add(loss)

    def finish_gradients(self) -> torch.Tensor:
        """The tree's sum into `.grad` on every rank; the step's mean loss (collective, see
        `TreeGradients.finish`)."""
        return self.tree.finish()

    def clip_gradients(self, max_norm: float | None) -> torch.Tensor | None:
        """Local: the gradients are the tree's sum, bit for bit the same on every rank."""
        self.precision.unscale_gradients(self.optimizer)
        return norm_and_clip(self.raw_model.parameters(), max_norm)

    def optimizer_step(self) -> bool | torch.Tensor:
        """The precision object unscales, checks for infs, steps and updates the scale; then the
        gradients are dropped. Collective with a loss scaler (its found-inf all-reduce)."""
        stepped = self.precision.optimizer_step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        return stepped
