"""The model a rank trains, built from the config: whole, or on the meta device for a strategy that shards it.

Both start from the same weights: a built-in model's seeded start is drawn module
by module (`clorch.builders.model.seeds_per_module`), a model of your own initializes
itself, and `model.init_from` then overwrites what its file holds. `ModelBuilder`
is what a parallel strategy (`clorch.strategies`) builds through: it decides where
the model lives, this module how it is made.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from clorch.checkpoint.weights import load_weights, weight_names
from clorch.config.schema import TrainConfig
from clorch.builders.model_options import apply_model_options
from clorch.nn.parallel.fsdp_init import allocate, init_fn_of, materialize, parameters_on_meta
from clorch.builders.model import build_model_for, seeds_per_module

__all__ = ["ModelBuilder", "build_raw_model"]


def build_raw_model(cfg: TrainConfig, task: Any, float8_all_gather: bool = False) -> nn.Module:
    """The whole model of `cfg.model` in train mode in host memory, sized by the task, initialized from
    `cfg.seed` (`seeds_per_module`: a built-in model module by module, as when it is sharded;
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
        materialize(model, "cpu", seed=cfg.seed, init_fn=init_fn_of(model))
    else:
        model = build_model_for(cfg, sizes)
    path = getattr(cfg.model, "init_from", None)
    if path is not None:
        load_weights(model, path, strict=cfg.model.init_strict)
    apply_model_options(cfg, model, float8_all_gather)
    return _train_mode(model)


def _train_mode(model: nn.Module) -> nn.Module:
    """The model in train mode: a factory may hand it back in eval mode (Hugging Face's
    `from_pretrained` does, and so does one ending in `.eval()`), which would train with
    dropout off and BatchNorm on its running statistics. Evaluation switches to eval mode
    and back (`clorch.train.evaluate`)."""
    return model.train()


class ModelBuilder:
    """The model of a config, for a strategy to build (`clorch.strategies.base.ModelSource`).

    - `whole()`: the whole model in host memory (`build_raw_model`).
    - `on_meta()`: where no rank need hold the whole model: a built-in model on the meta
      device; a model of your own with a `model.init_from` that holds every tensor of its
      state dict, built with its parameters on the meta device (`parameters_on_meta`: the
      buffers its `__init__` computes are kept). Otherwise None: a model of your own must be
      built whole to initialize itself.
    - `fill(model, device, covered)`: after sharding, storage and values shard by shard:
      seeded values by `materialize` (the weights `whole()` starts from, `seeds_per_module`)
      and then `model.init_from`'s tensors one at a time (`load_weights`); when the file holds
      every tensor nothing is drawn at all.

    Args:
        float8_all_gather: float8 layers all-gather their sharded weights in float8
            (`precision=fp8`'s `fsdp_float8_all_gather`, where the strategy shards).
    """

    def __init__(self, cfg: TrainConfig, task: Any, float8_all_gather: bool = False):
        self.cfg, self.task, self.float8_all_gather = cfg, task, float8_all_gather
        self.path = getattr(cfg.model, "init_from", None)

    def whole(self) -> nn.Module:
        return build_raw_model(self.cfg, self.task, self.float8_all_gather)

    def on_meta(self) -> tuple[nn.Module | None, bool]:
        """The model on meta with the config's changes applied (or None), and whether the
        init_from file holds every tensor of it (read once: a clorch checkpoint is verified on
        every read)."""
        model, covered = self._meta_model()
        if model is not None:
            apply_model_options(self.cfg, model, self.float8_all_gather)
        return model, covered

    def _meta_model(self) -> tuple[nn.Module | None, bool]:
        sizes = self.task.model_kwargs()
        if seeds_per_module(self.cfg):
            with torch.device("meta"):
                model = build_model_for(self.cfg, sizes)
            return model, self.path is not None and _covers(self.path, model)
        if self.path is None:
            return None, False
        try:
            with parameters_on_meta():
                model = build_model_for(self.cfg, sizes)
        except Exception:  # an __init__ that reads its weights' values: built whole, where it can
            return None, False
        return (model, True) if _covers(self.path, model) else (None, False)

    def fill(self, model: nn.Module, device: torch.device, covered: bool) -> nn.Module:
        """Local: every rank draws or reads the same full values and keeps its own slice.

        Raises:
            ValueError: an init_from file that does not fit the model.
        """
        if covered:
            allocate(model, device)  # every tensor comes from the file: nothing to draw
        else:
            materialize(model, device, seed=self.cfg.seed, init_fn=init_fn_of(model))
        if self.path is not None:
            load_weights(model, self.path, strict=self.cfg.model.init_strict)
        return _train_mode(model)


def _covers(path: str, model: nn.Module) -> bool:
    """Whether the file at `path` holds every tensor of the model's state dict (names only)."""
    return set(model.state_dict()) <= weight_names(path)
