"""The model a config names, and the data sizes it is given: one rule for the plan and the ranks.

The launch plan sizes the model on the meta device (its memory check) and the
ranks build it for training from the same call, so the two cannot disagree
about which arguments a model receives.
"""

from __future__ import annotations

import inspect
from dataclasses import asdict, fields
from typing import Any, Callable

from clorch.builders.data import model_sizes_of
from clorch.config.schema import MODEL_LOAD_KEYS, TargetModelConfig, TrainConfig
from clorch.config.targets import instantiate_nested, resolve_target
from clorch.config.user_code import names


def model_call(cfg: TrainConfig, data_sizes: dict[str, Any]) -> tuple[Callable[..., Any], dict[str, Any]]:
    """(what builds the model, its keyword arguments) for `cfg.model` and the data's sizes.

    Sizes the config leaves null come from the data; set ones win (e.g. a padded
    vocab_size of 50304 over byte tokens, for a GPT-2 shape). A model of your own
    (`model._target_`) gets only the data sizes its signature names (never through **kwargs),
    and its nested `{_target_: ...}` arguments (`model.config._target_`) are built first.
    """
    model = cfg.model
    given = (
        model.kwargs
        if isinstance(model, TargetModelConfig)
        else {k: v for k, v in asdict(model).items() if k != "name" and k not in MODEL_LOAD_KEYS}
    )
    given = {k: v for k, v in given.items() if v is not None}
    if isinstance(model, TargetModelConfig):
        target = resolve_target(model.target)
        return target, {**_accepted(target, data_sizes), **instantiate_nested(given, "model")}
    from clorch.models import build_model  # lazy: clorch.models imports torch

    return (lambda **kwargs: build_model(model.name, **kwargs)), {**data_sizes, **given}


def seeds_per_module(cfg: TrainConfig) -> bool:
    """Whether the model's seeded start is drawn module by module (`clorch.nn.parallel.fsdp.materialize`).

    True for the built-in models (`model=gpt`, `model=mlp`): the ranks build them on the meta
    device and draw each module's parameters from `cfg.seed` and the module's name, under
    `parallel=ddp` and `parallel=fsdp` alike, so both start from the same weights and no rank
    ever holds the whole model under `fsdp`. False for a model of your own (`model._target_`):
    its `__init__` initializes its weights, from torch's generator seeded with `cfg.seed`
    (`build_model_for`), and that initialization is kept.
    """
    return not isinstance(cfg.model, TargetModelConfig)


def build_model_for(cfg: TrainConfig, data_sizes: dict[str, Any] | None = None) -> Any:
    """The model of `cfg.model`, built by its constructor after `torch.manual_seed(cfg.seed)`.

    Identical on every rank and run. Under a `torch.device("meta")` context it has shapes
    only (the plan's checks); the ranks then give a built-in model its values by
    `seeds_per_module`'s rule.

    Args:
        data_sizes: the data's sizes (a task's `model_kwargs()`); None reads them from the
            data's config (clorch.builders.data.model_sizes_of).
    """
    import torch  # lazy: clorch-train --help and --cfg job import clorch.plan without torch

    if data_sizes is None:
        data_sizes = model_sizes_of(cfg)
    build, kwargs = model_call(cfg, data_sizes)
    torch.manual_seed(cfg.seed)
    return build(**kwargs)


def _accepted(target: Any, sizes: dict[str, Any]) -> dict[str, Any]:
    """The data's sizes (in_features, vocab_size, ...) that `target` names as arguments: a model
    of your own gets those it names, and no others (a factory's **kwargs gets none: it would
    hand them on to a constructor that never asked for them)."""
    return {k: v for k, v in sizes.items() if names(target, k)}


def data_sized_defaults(cfg: TrainConfig) -> dict[str, Any]:
    """A built-in model's sizes that its config leaves to the data (null, or no key of the
    config), with the defaults it takes where the data gives none; {} for a model of your own.

    For the error that explains a shape mismatch of a built-in model on a dataset of yours
    without `model_kwargs()`.
    """
    if isinstance(cfg.model, TargetModelConfig):
        return {}
    from clorch.models import MLP, GPTConfig  # lazy: clorch.models imports torch

    if cfg.model.name == "gpt":
        defaults = {f.name: f.default for f in fields(GPTConfig)}
    else:
        defaults = {n: p.default for n, p in inspect.signature(MLP.__init__).parameters.items() if n != "self"}
    given = model_call(cfg, {})[1]
    return {k: v for k, v in defaults.items() if k not in given}
