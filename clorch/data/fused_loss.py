"""The training split under `loss=chunked_cross_entropy`: the model computes the loss itself.

The model was given a forward that takes `target=` (`clorch.nn.fused_loss.fuse_output_loss`),
so the training loss is one call, `model(input, target=target)`, through DDP, FSDP and
torch.compile alike; the whole logits tensor is never made. Evaluation, sizes and batches are
the task's own: `eval_sums` calls `model(input)`, which still returns the logits, so eval_loss
and every metric are computed exactly as without the option.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class FusedLossTask:
    """`task` with its training loss computed by the model's fused output layer and loss."""

    def __init__(self, task: Any):
        self.inner = task

    def __getattr__(self, name: str) -> Any:  # batch, eval_sums, model_kwargs, tokens_per_sample, ...
        if name == "inner":  # not set yet (copy, pickle): no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __len__(self) -> int:
        return len(self.inner)

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean next-token cross-entropy over the batch's tokens (the task's loss: windows are equal)."""
        return model(batch["input"], target=batch["target"])
