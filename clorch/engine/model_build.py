"""The model a rank trains, built from the config: whole (`parallel=ddp`) or sharded (`parallel=fsdp`).

Both start from the same weights: a built-in model's seeded start is drawn module
by module (`clorch.plan.model.seeds_per_module`), a model of your own initializes
itself, and `model.init_from` then overwrites what its file holds.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from clorch.checkpoint.weights import load_weights, weight_names
from clorch.config.schema import TrainConfig
from clorch.nn.parallel.fsdp import (
    allocate,
    device_mesh,
    gpt_init_fn,
    materialize,
    parameters_on_meta,
    shard_model,
)
from clorch.engine.model_options import apply_model_options
from clorch.plan.model import build_model_for, seeds_per_module

__all__ = ["build_raw_model", "build_sharded_model"]


def build_raw_model(cfg: TrainConfig, task: Any) -> nn.Module:
    """The whole model of `cfg.model` in train mode in host memory, sized by the task, initialized from
    `cfg.seed` (`seeds_per_module`: a built-in model module by module, as under `parallel=fsdp`;
    a model of your own by its `__init__`), then from the weights of `model.init_from` when it
    names a file; then changed as the config says (`apply_model_options`: Liger, float8 layers,
    the fused loss, activation checkpointing).

    Raises:
        ValueError: the init_from file does not fit the model (the plan checks it first).
    """
    sizes = task.model_kwargs()
    if seeds_per_module(cfg):
        with torch.device("meta"):
            model = build_model_for(cfg, sizes)
        materialize(model, "cpu", seed=cfg.seed, init_fn=gpt_init_fn(model))
    else:
        model = build_model_for(cfg, sizes)
    path = getattr(cfg.model, "init_from", None)
    if path is not None:
        load_weights(model, path, strict=cfg.model.init_strict)
    apply_model_options(cfg, model)
    return _train_mode(model)


def _train_mode(model: nn.Module) -> nn.Module:
    """The model in train mode: a factory may hand it back in eval mode (Hugging Face's
    `from_pretrained` does, and so does one ending in `.eval()`), which would train with
    dropout off and BatchNorm on its running statistics. Evaluation switches to eval mode
    and back (`clorch.engine.evaluate`)."""
    return model.train()


def build_sharded_model(cfg: TrainConfig, task: Any, device: torch.device) -> nn.Module:
    """parallel=fsdp: the model sharded over every rank of the job (torch's fully_shard), in train
    mode, its shards on `device` (in host memory with `parallel.cpu_offload`).

    No rank holds the whole model, except where a model of your own must initialize itself:
    - a built-in model is built on the meta device, sharded, then given storage shard by shard:
      seeded values by `materialize` (the weights `parallel=ddp` starts from, `seeds_per_module`),
      and then `model.init_from`'s tensors one at a time (`load_weights`); when the file holds
      every tensor of the model nothing is drawn at all;
    - a model of your own with a `model.init_from` that holds every tensor of its state dict is
      built with its parameters on the meta device (`parameters_on_meta`: the buffers its
      `__init__` computes are kept), sharded, and filled from the file tensor by tensor;
    - otherwise a model of your own is built once in host memory, its `__init__` initializing
      it as under `ddp` (and `model.init_from` loaded into it), then each unit is cut to this
      rank's shard as it is sharded, and the whole is freed.

    Collective: every rank calls it (fully_shard over the mesh).

    Raises:
        ValueError: a `parallel.shard` class that is not in the model, or an init_from file
            that does not fit it.
    """
    parallel = cfg.parallel
    path = getattr(cfg.model, "init_from", None)
    home = torch.device("cpu") if parallel.cpu_offload else device  # where the shards live
    raw, covered = _on_meta(cfg, task, path)
    on_meta = raw is not None
    if not on_meta:
        raw = build_raw_model(cfg, task)
    else:
        apply_model_options(cfg, raw)
    if device.type == "cuda" and not parallel.cpu_offload:
        torch.cuda.set_device(device)  # fully_shard moves each unit to the current device
    # bf16 and fp16: parameters all-gathered and computed in that dtype, gradients
    # reduce-scattered in fp32 into fp32 shards (fp16's loss scaler unscales those);
    # parallel.param_dtype=fp32 gathers fp32 and leaves the casts to autocast, as under ddp.
    shard_model(
        raw,
        mesh=device_mesh(device.type),
        shard_modules=parallel.shard,
        min_params=parallel.min_params,
        reshard_after_forward=parallel.reshard_after_forward,
        precision="fp32" if parallel.param_dtype == "fp32" else (cfg.precision.runs_as or cfg.precision.name),
        cpu_offload=parallel.cpu_offload,
    )
    if on_meta:
        if covered:
            allocate(raw, home)  # every tensor comes from the file: nothing to draw
        else:
            materialize(raw, home, seed=cfg.seed, init_fn=gpt_init_fn(raw))
        if path is not None:
            load_weights(raw, path, strict=cfg.model.init_strict)
    return _train_mode(raw)


def _on_meta(cfg: TrainConfig, task: Any, path: str | None) -> tuple[nn.Module | None, bool]:
    """The model with its parameters on the meta device, or None where it must be built whole
    (a model of your own without an init_from file that holds all of it); and whether the
    init_from file holds every tensor of the model (read once: a clorch checkpoint is verified
    on every read)."""
    sizes = task.model_kwargs()
    if seeds_per_module(cfg):
        with torch.device("meta"):
            model = build_model_for(cfg, sizes)
        return model, path is not None and _covers(path, model)
    if path is None:
        return None, False
    try:
        with parameters_on_meta():
            model = build_model_for(cfg, sizes)
    except Exception:  # an __init__ that reads its weights' values: built whole, where it can
        return None, False
    return (model, True) if _covers(path, model) else (None, False)


def _covers(path: str, model: nn.Module) -> bool:
    """Whether the file at `path` holds every tensor of the model's state dict (names only)."""
    return set(model.state_dict()) <= weight_names(path)
