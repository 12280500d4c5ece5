"""Build everything one rank trains with from the config: `build_components(cfg, ctx)`.

Also usable in-process (a benchmark at world size 1): `ctx` only needs
`rank` and `world_size`, and the process group must already be initialized
when world_size > 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import nn


@dataclass
class Components:
    """One rank's training objects. `model` is the DDP wrapper; `raw_model` is what it wraps,
    before torch.compile (checkpoints and evaluation use it)."""

    model: Any                      # clorch.nn.parallel.DistributedDataParallel
    raw_model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any                  # torch.optim.lr_scheduler.LRScheduler
    scaler: Any                     # clorch.amp.GradScaler, or None without fp16
    task: Any                       # training split (clorch.data.tasks.Task)
    eval_task: Any                  # held-out split
    sampler: Any                    # clorch.data.DistributedSampler
    device: torch.device
    autocast_dtype: torch.dtype | None  # None: no autocast (fp32)
    batch_size: int                 # samples per micro-batch per rank
    accumulation: int               # micro-batches per optimizer step
    rank: int = 0
    world_size: int = 1

    @property
    def pin_memory(self) -> bool:
        """Pinned host batches make the host-to-device copy asynchronous."""
        return self.device.type == "cuda"

    def autocast(self):
        """The autocast context for forward passes (a pass-through for fp32)."""
        from clorch.amp import autocast

        dtype = self.autocast_dtype
        return autocast(self.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def _device(ctx: Mapping[str, Any]) -> torch.device:
    from clorch.distributed import device, is_initialized

    if is_initialized():
        return device()
    return torch.device("cuda", torch.cuda.current_device()) if ctx.get("backend") == "nccl" \
        else torch.device("cpu")


def build_tasks(cfg: Mapping[str, Any]) -> tuple[Any, Any]:
    """The train and eval splits of `cfg.data`."""
    from clorch.data.tasks import build_task

    data = {k: v for k, v in cfg["data"].items() if k != "name"}
    train = build_task(cfg["data"]["name"], split="train", seed=cfg["seed"], **data)
    held_out = build_task(cfg["data"]["name"], split="eval", seed=cfg["seed"], **data)
    return train, held_out


def build_raw_model(cfg: Mapping[str, Any], task: Any) -> nn.Module:
    """The model of `cfg.model`, sized by the task, initialized from `cfg.seed`."""
    from clorch.models import build_model

    # Sizes the config leaves null come from the data; set ones win (e.g. a
    # padded vocab_size of 50304 over byte tokens, for a GPT-2 shape).
    spec = {**task.model_kwargs(),
            **{k: v for k, v in cfg["model"].items() if k != "name" and v is not None}}
    torch.manual_seed(cfg["seed"])  # identical weights on every rank and in every run
    target = spec.pop("_target_", None)
    if target is not None:
        from clorch.config.targets import resolve_target

        return resolve_target(target)(**spec)
    return build_model(cfg["model"]["name"], **spec)


def _optimizer(cfg: Mapping[str, Any], model: nn.Module) -> torch.optim.Optimizer:
    from clorch.optim import build_optimizer

    o = cfg["optim"]
    extra = {"betas": tuple(o["betas"])} if o["name"] == "adamw" else {"momentum": o["momentum"]}
    return build_optimizer(o["name"], model.parameters(), lr=o["lr"],
                           weight_decay=o["weight_decay"], fused=o["fused"], **extra)


def _scheduler(cfg: Mapping[str, Any], optimizer: torch.optim.Optimizer, total_steps: int) -> Any:
    from clorch.optim import build_scheduler

    s = cfg["schedule"]
    if s["name"] == "constant":
        return build_scheduler(optimizer, "constant", warmup_steps=s["warmup_steps"])
    return build_scheduler(optimizer, s["name"], warmup_steps=s["warmup_steps"],
                           total_steps=total_steps, min_lr_ratio=s["min_lr_ratio"])


def _scaler(cfg: Mapping[str, Any], device: torch.device) -> Any:
    precision = cfg["precision"]
    if precision["name"] != "fp16" or not precision["scaler"].get("enabled", True):
        return None
    from clorch.amp import GradScaler

    s = precision["scaler"]
    return GradScaler(device.type, init_scale=s.get("initial_scale", 65536.0),
                      growth_factor=s.get("growth_factor", 2.0),
                      backoff_factor=s.get("backoff_factor", 0.5),
                      growth_interval=s.get("growth_interval", 2000), enabled=True)


def build_components(cfg: Mapping[str, Any], ctx: Mapping[str, Any],
                     total_steps: int | None = None) -> Components:
    """Build task, model (on the rank's device, compiled if asked, DDP-wrapped), optimizer,
    schedule, scaler and sampler from a validated config (a plain dict or a DictConfig).
    `total_steps` (for the cosine schedule) defaults to the config's plan.

    Every rank must call it: wrapping in DDP is a synchronization point (it checks
    parameter signatures and broadcasts rank 0's weights; see DistributedDataParallel).

    Raises:
        ValueError, TypeError: the builders reject a setting (validation catches most first).
    """
    from clorch.amp import precision_settings
    from clorch.data import DistributedSampler
    from clorch.nn.parallel import DistributedDataParallel

    if not isinstance(cfg, dict):  # a DictConfig from clorch.config.compose
        from omegaconf import OmegaConf

        cfg = OmegaConf.to_container(cfg, resolve=True)
    rank, world = int(ctx.get("rank", 0)), int(ctx.get("world_size", 1))
    device = _device(ctx)
    task, eval_task = build_tasks(cfg)
    raw = build_raw_model(cfg, task).to(device)
    inner = torch.compile(raw) if cfg.get("compile") else raw
    d = cfg["ddp"]
    model = DistributedDataParallel(inner, bucket_cap_mb=d["bucket_cap_mb"],
                                    first_bucket_cap_mb=d["first_bucket_cap_mb"],
                                    broadcast_buffers=d["broadcast_buffers"],
                                    reduce_dtype=d["reduce_dtype"])
    optimizer = _optimizer(cfg, raw)
    if total_steps is None:
        from clorch.engine.resolve import plan_steps

        total_steps = plan_steps(cfg, len(task), world)[2]
    s = cfg["sampler"]
    sampler = DistributedSampler(len(task), num_replicas=world, rank=rank,
                                 seed=cfg["seed"] if s["seed"] is None else s["seed"],
                                 shuffle=s["shuffle"], drop_last=s["drop_last"])
    return Components(model=model, raw_model=raw, optimizer=optimizer,
                      scheduler=_scheduler(cfg, optimizer, total_steps), scaler=_scaler(cfg, device),
                      task=task, eval_task=eval_task, sampler=sampler, device=device,
                      autocast_dtype=precision_settings(cfg["precision"]["name"])[0],
                      batch_size=cfg["batch_size"], accumulation=cfg["accumulation"],
                      rank=rank, world_size=world)
