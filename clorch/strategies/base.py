"""`Strategy`: what one `parallel` mode decides on a rank, in one class.

A rank's loop, evaluation, checkpoints and worker ask their strategy and never which
mode runs. A strategy is built from the config (`from_config`) and then set up with
what it acts on: the model (`setup(source, build_optimizer)`), the optimizer it
builds, the precision object that owns autocast and the loss scaler. It owns:

- set-up: wrap or shard the model, built whole or on the meta device (`setup`);
- accumulation without communication (`no_sync`);
- gradient clipping, collective where the gradients are sharded (`clip_gradients`);
- the optimizer step, through the precision object (`optimizer_step`, as Lightning
  Fabric's `Strategy.optimizer_step` calls `self.precision.optimizer_step`);
- the extra forwards a collective forward needs in evaluation (`padding_batches`);
- save and load in its format, finding the newest checkpoint and pruning old ones;
- the full state dict for export and the weights digest.

A strategy imports nothing from the rank's loop: it takes the model, batches,
sampler and state it acts on. A `parallel` option names its class as a string
(`ParallelOption.strategy`, e.g. "clorch.strategies.ddp:DDPStrategy").
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Protocol

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from clorch.checkpoint.policy import Latest
from clorch.config import registry

__all__ = [
    "ModelSource",
    "Strategy",
    "compile_mode_arg",
    "compile_mode_of",
    "compiled",
    "strategy_class",
    "weights_digest",
]


class ModelSource(Protocol):
    """How the rank builds its model, for a strategy that decides where (the engine provides it).

    `whole()`: the whole model in host memory, initialized, the config's changes applied
    (`clorch.builders.model_options`), in train mode. `on_meta()`: the model with its parameters
    on the meta device and the config's changes applied, or None where it must be built whole;
    and whether `model.init_from` holds every tensor of it. `fill(model, device, covered)`:
    storage and first values for a model from `on_meta()` after it was sharded.
    """

    def whole(self) -> nn.Module: ...

    def on_meta(self) -> tuple[nn.Module | None, bool]: ...

    def fill(self, model: nn.Module, device: torch.device, covered: bool) -> nn.Module: ...


def strategy_class(parallel: Any) -> type[Strategy]:
    """The `Strategy` class a `parallel` option names (its `strategy`, "module:Class")."""
    return registry.resolve(parallel.strategy)


def compile_mode_arg(mode: str) -> str | None:
    """torch.compile's `mode` for the config's `compile_mode` ("default" is torch's None)."""
    return None if mode == "default" else mode


def compile_mode_of(cfg: Any) -> Any:
    """torch.compile's mode for a config (`compiled`'s `mode`): False where `compile` is off."""
    return compile_mode_arg(cfg.compile_mode) if cfg.compile else False


def compiled(model: nn.Module, mode: Any) -> Any:
    """`torch.compile(model, mode=mode)`, or the model itself where `mode` is False (not compiled;
    None is torch's default mode)."""
    return model if mode is False else torch.compile(model, mode=mode)


def weights_digest(model: nn.Module) -> str:
    """SHA-256 of the model's state dict (names and exact bytes): equal iff the weights are.

    A sharded model's parameters are gathered whole, one at a time (collective then:
    every rank calls it; only the one reading the result needs it).

    Every entry counts: parameters and buffers of any dtype and shape (a 0-d
    scalar, BatchNorm's int64 `num_batches_tracked`, bool masks); a tied
    weight under each of its names; an entry that is not a tensor (a
    module's `get_extra_state()`) by its repr.
    """
    digest = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        digest.update(name.encode())
        if isinstance(value, DTensor):
            value = value.full_tensor()
        if isinstance(value, torch.Tensor):
            # reshape(-1): a 0-d tensor cannot be viewed as bytes; the bytes are the same either way.
            digest.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            digest.update(repr(value).encode())
    return digest.hexdigest()


class Strategy:
    """One `parallel` mode on one rank. Subclasses set the checkpoint format and override what differs.

    After `setup`: `raw_model` is the model as built (checkpoints, evaluation and export
    read it), `model` what the loop calls forward on (a wrapper, or a compiled model),
    `optimizer` the optimizer `setup` built over `raw_model`'s parameters.

    Collectives: `setup`, each synchronized backward, `optimizer_step` with a loss scaler,
    `save` and `load` are collective over the job's ranks: every rank calls them in the
    same order. What else is collective is said on each method.
    """

    # The checkpoint format: a step checkpoint's suffix and the final checkpoint's name.
    checkpoint_suffix: ClassVar[str] = ".ckpt"
    final_name: ClassVar[str] = "final.ckpt"

    def __init__(self, precision: Any, device: torch.device, rank: int = 0, world_size: int = 1):
        self.precision, self.device, self.rank, self.world_size = precision, device, rank, world_size
        self.raw_model: nn.Module | None = None
        self.model: Any = None
        self.optimizer: torch.optim.Optimizer | None = None

    @classmethod
    def from_config(cls, cfg: Any, precision: Any, device: torch.device, rank: int, world_size: int) -> Strategy:
        """The strategy for a checked config (a `TrainConfig`); a subclass reads its keys here."""
        return cls(precision, device, rank, world_size)

    # -- set-up and the step ---------------------------------------------------------------------

    def setup(self, source: ModelSource, build_optimizer: Callable[[nn.Module], torch.optim.Optimizer]) -> None:
        """Build the model from `source`, place it on the ranks, and build the optimizer over it."""
        raise NotImplementedError

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward inside accumulates locally; the next one outside reduces the sum (local)."""
        with self.model.no_sync():
            yield

    # What the loop asks around each micro-batch (`clorch.train.loop.train_step`). The defaults
    # accumulate under `no_sync` and reduce in the last backward; the exact strategies
    # (`ExactDDPStrategy`, `ExactFSDPStrategy`) sum in a tree.
    loss_is_global: ClassVar[bool] = False  # the step's loss is already the job's mean on every rank

    def loss_divisor(self, count: int) -> int:
        """What each of this rank's `count` micro-batch losses is divided by before backward."""
        return count

    @contextlib.contextmanager
    def micro_batch(self, index: int, count: int, step: int) -> Iterator[None]:
        """Around micro-batch `index` of `count` of optimizer step `step`: its forward and
        backward. Here: all but the last accumulate locally (`no_sync`); the last backward
        reduces, a synchronization point."""
        with contextlib.nullcontext() if index == count - 1 else self.no_sync():
            yield

    def after_backward(self, loss: torch.Tensor) -> None:
        """After each micro-batch's backward, with its (divided) loss. Local; nothing here."""

    def finish_gradients(self) -> torch.Tensor | None:
        """After the step's last backward: the gradients are complete in `.grad` once it returns.
        Returns the step's loss where the strategy summed it (`loss_is_global`), else None. Here
        nothing is left to do (the last backward reduced)."""
        return None

    def clip_gradients(self, max_norm: float | None) -> torch.Tensor | None:
        """Unscale the step's gradients, take their total 2-norm, clip them to `max_norm` when given.

        Returns the norm before clipping (a 0-d device tensor), or None when no parameter
        has a gradient. Local unless a subclass says otherwise.
        """
        raise NotImplementedError

    def optimizer_step(self) -> bool | torch.Tensor:
        """Step the optimizer through the precision object, then zero the gradients.

        Returns True when it stepped, False (or a 0-d bool tensor) when the loss scaler
        skipped the step. Collective with a loss scaler (its found-inf all-reduce).
        """
        raise NotImplementedError

    def padding_batches(self, batches: int, batches_of_rank0: int) -> int:
        """How many extra forwards (results ignored) this rank runs in evaluation, given its own
        number of eval batches and rank 0's: none, unless the forward is collective."""
        return 0

    # -- checkpoints ------------------------------------------------------------------------------

    @classmethod
    def step_path(cls, directory: Path, step: int) -> Path:
        """The step checkpoint's path in `directory`."""
        raise NotImplementedError

    @classmethod
    def find_latest(cls, directory: Path) -> Latest:
        """The newest step checkpoint in `directory` that verifies, and the newer ones skipped. Rank 0."""
        raise NotImplementedError

    @classmethod
    def prune(cls, directory: Path, keep_last: int) -> None:
        """Keep the newest `keep_last` step checkpoints in `directory`. Rank 0 only."""
        raise NotImplementedError

    @classmethod
    def parameters_held(cls, parallel: Any, params: int, world_size: int, device_type: str) -> int:
        """How many of the model's `params` parameters a rank keeps on its device."""
        return params

    def save(self, path: Path, sampler: Any, state: dict[str, Any]) -> None:
        """Write model, optimizer, sampler, loss scaler and `state` to `path` (collective)."""
        raise NotImplementedError

    def load(self, path: Path, sampler: Any) -> Any:
        """Load model, optimizer, sampler and loss scaler from `path`; return the saved state (collective)."""
        raise NotImplementedError

    # -- the trained weights ----------------------------------------------------------------------

    def export_weights(self) -> Any:
        """What rank 0 writes as the final weights (a module or an object with `state_dict()`);
        None on the other ranks. Every rank calls it (collective where the weights are sharded)."""
        return self.raw_model if self.rank == 0 else None

    def weights_digest(self) -> str | None:
        """`weights_digest` of the trained weights on rank 0, None on the others. Every rank calls it."""
        return weights_digest(self.raw_model) if self.rank == 0 else None
