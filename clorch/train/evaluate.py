"""Evaluation on the held-out split, exact across ranks.

Each data-parallel rank d of D (the job's `ParallelLayout`: every rank under ddp, fsdp
and hsdp) evaluates the indices d, d + D, ... of the eval split (strided, no padding),
so every sample is counted exactly once; the per-rank sums are all-reduced and divided once.
Every rank evaluates the same model: rank 0's, the one checkpoints and exports hold (its buffers, such as
BatchNorm's running statistics, are lent to the other ranks for the while;
`clorch.nn.parallel.buffers`).
"""

from __future__ import annotations

import torch

from clorch.config.layout import ParallelLayout
from clorch.data.tasks import finalize_metrics
from clorch.distributed import all_reduce, is_initialized
from clorch.train.components import Components
from clorch.train.loop import micro_batches, to_device
from clorch.nn.parallel.buffers import rank0_buffers


def _local_sums(parts: Components, layout: ParallelLayout) -> dict[str, torch.Tensor]:
    indices = torch.arange(layout.dp_rank(parts.rank), len(parts.eval_task), layout.dp_size)
    sums: dict[str, torch.Tensor] = {}
    index_batches = [indices[start : start + parts.batch_size] for start in range(0, indices.numel(), parts.batch_size)]
    _pad_forwards(parts, layout, index_batches)
    for batch in micro_batches(parts.eval_task, index_batches):
        batch = to_device(batch, parts.device, parts.pin_memory)
        with parts.autocast():
            part = parts.eval_task.eval_sums(parts.raw_model, batch)
        for key, value in part.items():
            sums[key] = sums[key] + value if key in sums else value.to(torch.float64)
    return sums


def _pad_forwards(parts: Components, layout: ParallelLayout, index_batches: list[torch.Tensor]) -> None:
    """Where the strategy's forward is collective (a sharded model all-gathers each unit), a rank
    with fewer batches than rank 0 runs as many more forwards, on its first sample, and ignores them.

    The strided split gives ranks at most one sample less than rank 0, so at most one batch.
    """
    batches_of_rank0 = -(-len(range(0, len(parts.eval_task), layout.dp_size)) // parts.batch_size)
    for _ in range(parts.strategy.padding_batches(len(index_batches), batches_of_rank0)):
        batch = next(iter(micro_batches(parts.eval_task, [index_batches[0] if index_batches else torch.tensor([0])])))
        with parts.autocast():
            parts.eval_task.eval_sums(parts.raw_model, to_device(batch, parts.device, parts.pin_memory))


@torch.no_grad()
def evaluate(parts: Components, layout: ParallelLayout | None = None) -> dict[str, float]:
    """The eval metrics (e.g. {"loss": ..., "exact": ...}) over the whole eval split.

    `layout` (the plan's) says which share of the split this rank evaluates; None, for
    components built by hand, has each of `parts.world_size` ranks evaluate its own share.

    Every rank must call it: each forward of a sharded model is collective (every rank
    runs as many; see `_pad_forwards`); it starts with a broadcast of rank 0's buffers
    (when the model has any) and ends in one all_reduce of the sums (blocks
    until all ranks arrive; raises what the collective raises). A rank with no
    eval samples (eval split smaller than the data-parallel size) would not know the
    metric names, so the split must hold at least one sample a data-parallel rank.

    Raises:
        ValueError: the eval split has fewer samples than data-parallel ranks.
    """
    if layout is None:
        layout = ParallelLayout.data_parallel(parts.world_size)
    if len(parts.eval_task) < layout.dp_size:
        raise ValueError(
            f"the eval split has {len(parts.eval_task)} samples, fewer than the {layout.dp_size} ranks: use more data"
        )
    was_training = parts.raw_model.training
    world = parts.world_size if is_initialized() else 1
    parts.raw_model.eval()
    try:
        with rank0_buffers(parts.raw_model, world):
            sums = _local_sums(parts, layout)
    finally:
        parts.raw_model.train(was_training)
    keys = sorted(sums)
    packed = torch.stack([sums[k] for k in keys])
    if is_initialized() and parts.world_size > 1:
        all_reduce(packed, op="sum")
    metrics = finalize_metrics(dict(zip(keys, packed.cpu())))
    derived = getattr(parts.eval_task, "derived_metrics", None)  # e.g. perplexity from the exact loss
    return {**metrics, **derived(metrics)} if derived is not None else metrics
