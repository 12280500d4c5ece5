"""What the config changes in a built model before DDP, fully_shard or torch.compile wrap it.

In this order: Liger-Kernel's patches of a Hugging Face model (`model.liger`), float8
Linear layers (`precision=fp8`), the fused output layer and loss
(`loss=chunked_cross_entropy`), then activation checkpointing (`model.activation_checkpointing`,
last, because it wraps the blocks the others look into by name). None of them changes the
state dict's keys, so checkpoints, resume, export and `model.init_from` are those of the plain
model. Local: no collective.
"""

from __future__ import annotations

import logging

from torch import nn

from clorch.amp.float8 import convert_to_float8
from clorch.config.options.chunked_loss import ChunkedCrossEntropyConfig
from clorch.config.options.precision import FP8Config
from clorch.config.schema import TrainConfig
from clorch.nn.fused_loss import fuse_output_loss
from clorch.nn.liger import apply_liger
from clorch.nn.parallel.fsdp import apply_activation_checkpointing

log = logging.getLogger(__name__)


def apply_model_options(cfg: TrainConfig, model: nn.Module, float8_all_gather: bool = False) -> nn.Module:
    """Apply the config's model changes to `model` in place (module docstring); returns it.

    `float8_all_gather`: float8 layers all-gather their sharded weights in float8 (the
    `parallel` option says whether it shards them: `ParallelOption.float8_all_gather`).

    Raises:
        ImportError: an optional extra is missing (the plan checks it first).
        TypeError, ValueError: the model does not fit an option (no Liger support for its
            architecture, no forward_hidden/output_weight for the fused loss).
    """
    if getattr(cfg.model, "liger", False):
        apply_liger(model)
    if isinstance(cfg.precision, FP8Config):
        fp8 = cfg.precision
        layers = convert_to_float8(
            model, recipe=fp8.recipe, fsdp_float8_all_gather=float8_all_gather, **fp8.layer_rule()
        )
        log.info("precision=fp8: %d Linear layers in float8 (%s)", len(layers), ", ".join(layers) or "none")
    if isinstance(cfg.loss, ChunkedCrossEntropyConfig):
        fuse_output_loss(model, cfg.loss.chunk_size)
    if getattr(cfg.model, "activation_checkpointing", False):  # before DDP or fully_shard, as torch advises
        apply_activation_checkpointing(model, "auto")
    return model
