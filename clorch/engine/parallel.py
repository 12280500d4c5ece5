"""How each `parallel` option places the model on the ranks; its `builds` names one of these.

Each takes (cfg, task, device, precision) and returns (the raw model, the model the loop trains,
the optimizer). Every rank must call it: wrapping in DDP checks parameter signatures and
broadcasts rank 0's weights, and sharding runs fully_shard over the job's ranks; both block
until every rank arrives and raise what the builders raise (ValueError, TypeError).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from clorch.amp import MixedPrecision
from clorch.config.schema import TrainConfig
from clorch.engine.components import build_optimizer, compile_mode_arg
from clorch.engine.model_build import build_raw_model, build_sharded_model
from clorch.nn.parallel import DistributedDataParallel
from clorch.nn.parallel.fsdp import ShardedTrainer


def replicated(
    cfg: TrainConfig, task: Any, device: torch.device, precision: MixedPrecision
) -> tuple[nn.Module, Any, torch.optim.Optimizer]:
    """parallel=ddp: the whole model on every rank, in clorch's DistributedDataParallel."""
    raw = build_raw_model(cfg, task).to(device)
    inner = torch.compile(raw, mode=compile_mode_arg(cfg.compile_mode)) if cfg.compile else raw
    ddp = cfg.ddp
    model = DistributedDataParallel(
        inner,
        bucket_cap_mb=ddp.bucket_cap_mb,
        first_bucket_cap_mb=ddp.first_bucket_cap_mb,
        broadcast_buffers=ddp.broadcast_buffers,
        reduce_dtype=ddp.reduce_dtype,
        gradient_as_bucket_view=ddp.gradient_as_bucket_view,
        overlap_grad_copies=ddp.overlap_grad_copies,
    )
    optimizer = build_optimizer(cfg, raw)
    if ddp.step_in_backward and cfg.optim.grad_clip is not None:
        raise ValueError(
            f"optim.grad_clip={cfg.optim.grad_clip} cannot run with ddp.step_in_backward=true: "
            "each bucket's parameters are stepped before the whole gradient's norm is known "
            "(set optim.grad_clip=null or ddp.step_in_backward=false)"
        )
    if ddp.step_in_backward:
        model.step_in_backward(optimizer)
    return raw, model, optimizer


def sharded(
    cfg: TrainConfig, task: Any, device: torch.device, precision: MixedPrecision
) -> tuple[nn.Module, Any, torch.optim.Optimizer]:
    """parallel=fsdp: torch's fully_shard; each rank holds its shard of the model's state."""
    raw = build_sharded_model(cfg, task, device)
    compiled = torch.compile(raw, mode=compile_mode_arg(cfg.compile_mode)) if cfg.compile else None
    optimizer = build_optimizer(cfg, raw)  # after sharding: its state is sharded too
    return raw, ShardedTrainer(raw, compiled, optimizer=optimizer, scaler=precision.scaler), optimizer
