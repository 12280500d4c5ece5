"""Modules whose training depends on how a step's samples are grouped into micro-batches.

A resume onto another world size keeps each optimizer step's samples (`clorch.plan.resume`), but
groups them into other micro-batches: on 2 ranks rank r's micro-batch holds the step's positions
r, r + 2, ...; on 1 rank with accumulation 2, positions 0-7 and then 8-15 (a global batch of 16).
Most layers see each sample alone, so the step's gradient is the same sum. BatchNorm normalizes
each micro-batch by its own mean and variance, and its running statistics (rank 0's, which
checkpoints and evaluation hold) move once per forward of rank 0: such a run leaves the
uninterrupted one's losses, weights, running statistics and eval from the first resumed step.
"""

from __future__ import annotations

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm


def batch_statistics_modules(model: nn.Module) -> list[str]:
    """The names of `model`'s modules that normalize by their micro-batch (BatchNorm, SyncBatchNorm)
    or count their forwards in running statistics (InstanceNorm with `track_running_stats`)."""
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, _BatchNorm) or (isinstance(module, _InstanceNorm) and module.track_running_stats)
    ]


def world_size_warning(model: nn.Module, saved_world: int, world: int, accumulation: int) -> str | None:
    """One line for a resume from `saved_world` ranks onto `world` (with `accumulation`) of a model
    with batch statistics, saying what then differs from the uninterrupted run; None without them."""
    names = batch_statistics_modules(model)
    if not names:
        return None
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (
        f"warning: {type(model).__name__}'s batch statistics ({shown}) do not carry over from {saved_world} "
        f"to {world} rank(s): each step's samples are grouped into other micro-batches, which BatchNorm "
        f"normalizes by their own statistics, and the running statistics now move {accumulation} time(s) "
        "a step, from other micro-batches; losses, weights, running statistics and eval leave the "
        "uninterrupted run's (docs/scale-out.md, What is kept)"
    )
