"""The training loop: one optimizer step (`train_step`) and the run around it (`fit`).

`build_components(cfg, ctx)` (re-exported here) builds what a rank trains
with; `train_step(components, micro_batches)` is one optimizer step with
gradient accumulation. Neither syncs host and device: the loss stays a tensor,
and `fit` reads it (`.item()`) only on logging steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from clorch.data.user import batch_size_of
from clorch.train.components import Components, build_components

__all__ = ["Components", "StepResult", "build_components", "micro_batches", "to_device", "train_step", "fit"]


@dataclass
class StepResult:
    """What one optimizer step produced."""

    loss: torch.Tensor  # this rank's mean micro-batch loss, detached, on the device (the job's,
    # where the strategy sums the step in a fixed order: `Strategy.loss_is_global`)
    stepped: Any  # False when the scaler skipped the update (fp16 overflow); a 0-d bool
    # tensor when the scaler decided on the device (read it only when needed)
    samples: int  # samples this rank trained on in the step
    lr: float = 0.0  # the learning rate the step ran with (the first param group's)
    grad_norm: Any = None  # total 2-norm of the averaged, unscaled gradients before clipping
    # (a 0-d device tensor; None: no parameter had a gradient)


def to_device(batch: Any, device: torch.device, pin: bool) -> Any:
    """Move a batch's tensors to `device` without blocking the host (host tensors pinned first
    when `pin`); a batch is a tensor, or a dict, tuple or list of them (nested), as a
    collate function makes it.

    A batch gathered from a task already on the device (`clorch.data.placement`)
    is passed through as it is.
    """
    if device.type == "cpu":
        return dict(batch) if isinstance(batch, Mapping) else batch
    return _moved(batch, device, pin)


def _moved(value: Any, device: torch.device, pin: bool) -> Any:
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            return value
        return (value.pin_memory() if pin and not value.is_pinned() else value).to(device, non_blocking=True)
    if isinstance(value, Mapping):
        return {k: _moved(v, device, pin) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple keeps its type
        return type(value)(*(_moved(v, device, pin) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_moved(v, device, pin) for v in value)
    return value


def micro_batches(task: Any, index_batches: Sequence[Any], epoch: int = 0) -> Iterator[Any]:
    """The task's batches at each index list in turn: through its own loader (a dataset of
    yours: torch's DataLoader and its workers) when it has one, else gathered here."""
    iterate = getattr(task, "iterate", None)
    if iterate is not None:
        return iterate(index_batches, epoch)
    return (task.batch(ix) for ix in index_batches)


def train_step(parts: Components, micro_batches: Sequence[Mapping[str, torch.Tensor]], step: int = 0) -> StepResult:
    """Forward and backward each micro-batch, then step optimizer, scaler and schedule.

    `parts.precision` runs the forwards under its autocast and the backwards
    (scaled for fp16); the parallel mode's strategy (`parts.strategy`) runs the
    rest: all micro-batches but the last under its `no_sync`, so gradients are
    reduced once per step; then `clip_gradients` (unscaled, measured and, with
    `parts.grad_clip`, clipped to that total norm: collective where the
    gradients are sharded) and `optimizer_step` (through the precision object:
    unscale, skip on overflow, update the scale). Every rank must call it with
    the same number of micro-batches: the last backward is a synchronization
    point (the gradient reduction) and so is the step with a scaler (its
    found-inf all-reduce; see `MixedPrecision.optimizer_step`).

    `step` is the optimizer step's number (from 0), which a strategy may key the step's
    random draws to (`exact=true`).

    Raises:
        ValueError: `micro_batches` is empty, or holds more than one batch while
            the model replays CUDA graphs (`parts.cuda_graphs`).
    """
    if not micro_batches:
        raise ValueError("micro_batches must hold at least one batch, got none")
    precision, strategy = parts.precision, parts.strategy
    count = len(micro_batches)
    if parts.cuda_graphs:
        if count > 1:
            raise ValueError(
                f"train_step got {count} micro-batches, but the model replays CUDA graphs "
                "(compile_mode reduce-overhead or max-autotune), whose outputs, gradients "
                "included, are overwritten by the next forward: pass one micro-batch a step"
            )
        # A new step: the CUDA graphs may reuse the memory of the last step's outputs (the
        # gradients were stepped and set to None; `total` below is a fresh tensor).
        torch.compiler.cudagraph_mark_step_begin()
    total = torch.zeros((), device=parts.device)
    samples, divisor = 0, strategy.loss_divisor(count)
    for i, batch in enumerate(micro_batches):
        batch = to_device(batch, parts.device, parts.pin_memory)
        samples += batch_size_of(batch)
        with strategy.micro_batch(i, count, step):
            with precision.autocast():
                loss = parts.task.loss(parts.model, batch) / divisor
            precision.backward(loss)
            strategy.after_backward(loss)
        total += loss.detach().float()
    summed = strategy.finish_gradients()  # the job's loss, where the strategy summed it in order
    if summed is not None:
        total = summed
    # After the all-reduce (the last backward) and unscaling, the same on every rank: the norm is
    # logged, and clipped to optim.grad_clip when set.
    grad_norm = strategy.clip_gradients(parts.grad_clip)
    lr = parts.optimizer.param_groups[0]["lr"]  # before the schedule moves it on to the next step's
    # Through the precision object: it steps (skipping an fp16 overflow); the gradients are zeroed.
    stepped = strategy.optimizer_step()
    parts.scheduler.step()
    return StepResult(loss=total, stepped=stepped, samples=samples, lr=float(lr), grad_norm=grad_norm)


@dataclass
class LoopState:
    """Where training is: saved in checkpoints and restored on resume."""

    step: int = 0
    epoch: int = 0
    resumed: bool = False  # the sampler's epoch is already set and partly consumed
    window_loss: Any = None  # device tensor: sum of step losses since the last log
    window_norm: Any = None  # device tensors: sum and count of the finite gradient norms
    window_norms: Any = None  #   since the last log (an fp16 overflow's inf is left out)
    lr: float | None = None  # the learning rate of the last step
    window_steps: int = 0
    window_samples: int = 0
    window_start: float = field(default_factory=time.perf_counter)
    # On resume: the run directory that wrote the checkpoint, whose metrics.jsonl holds the
    # run's history up to `step` (None: a fresh start, or a checkpoint that does not say).
    resumed_run_dir: str | None = None
    # On resume onto another world size: what kept the global batch, one line (clorch.train.checkpoints).
    resume_note: str | None = None
    # On resume onto another world size of a model with batch statistics: what differs from the
    # uninterrupted run, one line for the console (clorch.train.batch_statistics).
    resume_warning: str | None = None


def _add_norm(state: LoopState, norm: torch.Tensor | None) -> None:
    """Add a step's gradient norm to the window, on the device (no host sync)."""
    if norm is None:
        return
    finite = torch.isfinite(norm)
    value, count = torch.where(finite, norm, torch.zeros_like(norm)).float(), finite.float()
    if state.window_norm is None:
        state.window_norm, state.window_norms = value, count
    else:
        state.window_norm, state.window_norms = state.window_norm + value, state.window_norms + count


def _step_chunks(indices: Any, per_step: int, batch_size: int) -> list[list[Any]]:
    steps = []
    for start in range(0, len(indices), per_step):
        chunk = indices[start : start + per_step]
        steps.append([chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)])
    return steps


def fit(
    parts: Components, total_steps: int, state: LoopState, after_step: Callable[[LoopState, StepResult], None]
) -> LoopState:
    """Train until `total_steps`, calling `after_step` (logging, eval, checkpoints) after each step.

    Every rank must call it with the same arguments: each step is a
    synchronization point (see `train_step`), and so is `after_step` when it
    logs, evaluates or checkpoints.
    """
    per_step = parts.batch_size * parts.accumulation
    while state.step < total_steps:
        if not state.resumed:
            parts.sampler.set_epoch(state.epoch)
        state.resumed = False
        steps = _step_chunks(parts.sampler.sample_indices(), per_step, parts.batch_size)
        batches = micro_batches(parts.task, [ix for micro in steps for ix in micro], state.epoch)
        for micro_indices in steps:
            result = train_step(parts, [next(batches) for _ in micro_indices], state.step)
            parts.sampler.advance(sum(len(ix) for ix in micro_indices))
            state.step += 1
            loss = result.loss
            state.window_loss = loss if state.window_loss is None else state.window_loss + loss
            state.window_steps += 1
            state.window_samples += result.samples
            state.lr = result.lr
            _add_norm(state, result.grad_norm)
            after_step(state, result)
            if state.step >= total_steps:
                return state
        state.epoch += 1
    return state
