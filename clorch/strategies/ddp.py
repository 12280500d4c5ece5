"""`DDPStrategy` (parallel=ddp): the whole model on every rank, in clorch's DistributedDataParallel.

Checkpoints are file archives (`clorch.checkpoint.save_checkpoint`: `step_00000100.ckpt`,
`final.ckpt`); rank 0 holds the whole model for export and the digest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from clorch.checkpoint import load_checkpoint, prune_checkpoints, save_checkpoint, step_checkpoint_path
from clorch.checkpoint.metadata import read as read_metadata
from clorch.checkpoint.policy import Latest, find_latest_checkpoint
from clorch.nn.parallel import DistributedDataParallel
from clorch.nn.parallel.grad_norm import norm_and_clip
from clorch.strategies.base import ModelSource, Strategy, compile_mode_of, compiled

SAMPLER_KEY = "sampler_position"
"""A checkpoint file's state: the sampler's `global_state_dict()` (sharded checkpoints hold it
in their own clorch.json), which continues the epoch on any world size."""


class DDPStrategy(Strategy):
    """parallel=ddp: clorch's DistributedDataParallel, configured by the `ddp` group's keys.

    Args:
        ddp: the `ddp` option (`clorch.config.options.ddp.DDPConfig`) or any object with its keys.
        compile_mode: torch.compile's mode for the wrapped model; False: not compiled.
    """

    def __init__(
        self,
        precision: Any,
        device: torch.device,
        rank: int = 0,
        world_size: int = 1,
        *,
        ddp: Any = None,
        compile_mode: Any = False,
    ):
        super().__init__(precision, device, rank, world_size)
        self.ddp, self.compile_mode = ddp, compile_mode

    @classmethod
    def from_config(cls, cfg: Any, precision: Any, device: torch.device, rank: int, world_size: int) -> DDPStrategy:
        return cls(precision, device, rank, world_size, ddp=cfg.ddp, compile_mode=compile_mode_of(cfg))

    def setup(self, source: ModelSource, build_optimizer: Callable[[nn.Module], torch.optim.Optimizer]) -> None:
        """Build the whole model, wrap it (a collective: DDP checks parameter signatures and
        broadcasts rank 0's weights), build the optimizer and, with `ddp.step_in_backward`, let
        backward step it bucket by bucket (`optim.grad_clip` is refused with it by its option)."""
        raw = source.whole().to(self.device)
        ddp = self.ddp
        self.model = DistributedDataParallel(
            compiled(raw, self.compile_mode),
            bucket_cap_mb=ddp.bucket_cap_mb,
            first_bucket_cap_mb=ddp.first_bucket_cap_mb,
            broadcast_buffers=ddp.broadcast_buffers,
            reduce_dtype=ddp.reduce_dtype,
            gradient_as_bucket_view=ddp.gradient_as_bucket_view,
            overlap_grad_copies=ddp.overlap_grad_copies,
        )
        self.raw_model, self.optimizer = raw, build_optimizer(raw)
        if ddp.step_in_backward:
            self.model.step_in_backward(self.optimizer)

    def clip_gradients(self, max_norm: float | None) -> torch.Tensor | None:
        """Local: the gradients are the all-reduced average, the same on every rank. The precision
        object unscales them through DDP's flat buckets where those hold every gradient."""
        model, optimizer = self._wrapper(), self.optimizer
        # Under ddp.step_in_backward backward stepped already (no scaler can be in play): the
        # averages are still in .grad, to be measured; `optim.grad_clip` is refused with it by the
        # ddp option's rules (clorch.config.options.ddp).
        if model.optimizer_in_backward is not optimizer:
            self.precision.unscale_gradients(optimizer, flats=model.flat_gradients(optimizer))
        return norm_and_clip(self.raw_model.parameters(), max_norm)

    def optimizer_step(self) -> bool | torch.Tensor:
        """The precision object unscales (DDP's flat buckets, where they hold every gradient),
        checks for infs, steps and updates the scale; then the gradients are zeroed. Backward
        stepped already under `step_in_backward`: only the zeroing is left.

        Raises:
            TypeError: the model is not a clorch DistributedDataParallel, the optimizer or the
                precision's scaler cannot step.
            ValueError: no model (before setup), no synchronized backward since the last step,
                or a loss scaler with an optimizer that backward steps (its skip would come too late).
        """
        model, optimizer = self._wrapper(), self.optimizer
        model.begin_step()
        if model.optimizer_in_backward is not optimizer:
            stepped = self.precision.optimizer_step(optimizer, flats=model.flat_gradients(optimizer))
        elif self.precision.scaler is not None:
            raise ValueError(
                f"{type(self).__name__}.optimizer_step(): a scaler cannot skip a step that backward "
                "already took (step_in_backward); use bf16 or fp32 without a scaler"
            )
        else:
            stepped = True
        model.end_step()
        optimizer.zero_grad(set_to_none=True)
        return stepped

    def _wrapper(self) -> DistributedDataParallel:
        """The model the step goes through: clorch's DistributedDataParallel (`setup` wraps it;
        `clorch.strategies.adopt` takes one wrapped by hand)."""
        if self.model is None:
            raise ValueError(f"{type(self).__name__} has no model to step yet: call setup() first")
        if not isinstance(self.model, DistributedDataParallel):
            raise TypeError(
                "model must be None or a clorch DistributedDataParallel, got "
                f"{type(self.model).__name__}: {type(self).__name__} steps through clorch's wrapper "
                "(None until setup() wraps the model; wrap a model of yours in "
                "clorch.nn.parallel.DistributedDataParallel before adopt())"
            )
        return self.model

    # -- checkpoints: one file archive, written by rank 0 with every rank's own state ---------------

    @classmethod
    def step_path(cls, directory: Path, step: int) -> Path:
        return step_checkpoint_path(directory, step)

    @classmethod
    def find_latest(cls, directory: Path) -> Latest:
        return find_latest_checkpoint(directory)

    @classmethod
    def prune(cls, directory: Path, keep_last: int) -> None:
        prune_checkpoints(directory, keep_last)

    def save(self, path: Path, sampler: Any, state: dict[str, Any]) -> None:
        """The file holds each rank's sampler state and the job's global position (`SAMPLER_KEY`)."""
        state[SAMPLER_KEY] = sampler.global_state_dict()
        # An epoch continued from another world size has no per-rank position (its state_dict
        # raises): the global one above is the position then.
        per_rank = None if sampler.continues_another_world_size else sampler
        save_checkpoint(
            path,
            model=self.raw_model,
            optimizer=self.optimizer,
            sampler=per_rank,
            scaler=self.precision.scaler,
            state=state,
        )

    def load(self, path: Path, sampler: Any) -> Any:
        """The ranks take their own sampler state when the world size is the saved one, else
        the global position (derived from rank 0's state for a file written before clorch saved it)."""
        position = self._global_position(path, sampler)
        if position is not None:
            # The same on every rank (one file, no rank's own part): every rank raises alike.
            sampler.check_global_state_dict(position)
        saved = load_checkpoint(
            path,
            model=self.raw_model,
            optimizer=self.optimizer,
            sampler=sampler if position is None else None,
            scaler=self.precision.scaler,
        )
        if position is not None:
            sampler.load_global_state_dict(position)
        return saved

    def _global_position(self, path: Path, sampler: Any) -> dict[str, Any] | None:
        """The global sampler position to continue from, or None: each rank loads its own state
        (the same world size, and a checkpoint holding it), or load_checkpoint says why it cannot."""
        try:
            body = read_metadata(path)
        except Exception:  # load_checkpoint reports it, on every rank alike
            return None
        samplers, state = body["samplers"], body["state"]
        same = body["world_size"] == self.world_size
        if same and samplers[self.rank] is not None:
            return None
        position = state.get(SAMPLER_KEY) if isinstance(state, dict) else None
        if position is None and not same and samplers[0] is not None:
            try:
                position = sampler.global_state_of(samplers[0])
            except (TypeError, ValueError):
                return None  # a malformed state: load_checkpoint names it
        return position
