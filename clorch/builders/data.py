"""The data a config names, built or sized: one rule for the launch plan and the ranks.

A built-in task (`data=synthetic`, `arithmetic`, `text`, `tokens`) is sized from its
arguments without building it (`clorch.data.tasks`). A dataset of your own
(`data._target_`) is built: if its class takes a `split` argument, once with
`split="train"` and once with `split="eval"`; otherwise its last
`data.eval_fraction` is held out. Its batches go through `clorch.data.user.DatasetTask`
with the loss (`loss=cross_entropy`, `mse`, `loss._target_`) or the step
(`step._target_`, or `loss=from_model`: the model's own loss) the config names. A built-in
task with a step (`data=tokens step._target_=...` or `loss=from_model`) keeps its batches and
takes its loss from the step (`clorch.data.from_model.SteppedTask`).

The launch plan builds the user's datasets once in the launching process (their
sizes, and the checks of `clorch.plan.user_checks`); each rank builds its own.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict
from typing import Any, Callable

from clorch.config.schema import FromModelLossConfig, LossConfig, TargetDataConfig, TargetFunctionConfig, TrainConfig
from clorch.config.targets import instantiate_nested, resolve_target
from clorch.config.user_code import takes


def data_kwargs(cfg: TrainConfig) -> dict[str, Any]:
    """A built-in data section's keys other than `name`: the task builder's keyword arguments."""
    return {k: v for k, v in asdict(cfg.data).items() if k != "name"}


def is_user_data(cfg: Any) -> bool:
    """Whether the config's data is a dataset of yours (`data._target_`)."""
    return isinstance(cfg.data, TargetDataConfig)


def _call(section: TargetFunctionConfig, where: str) -> Callable[..., Any]:
    """The function a `loss._target_` / `step._target_` names (the section at `where`), with the
    section's keyword arguments."""
    target = resolve_target(section.target)
    kwargs = instantiate_nested(section.kwargs, where)
    return functools.partial(target, **kwargs) if kwargs else target


def loss_of(cfg: TrainConfig) -> str | Callable[..., Any] | None:
    """The loss name ("cross_entropy", "mse") or function the config names; None for "auto" and
    for "from_model" (whose loss is a step: `step_of`)."""
    loss = cfg.loss
    if isinstance(loss, TargetFunctionConfig):
        return _call(loss, "loss")
    if isinstance(loss, FromModelLossConfig) or (isinstance(loss, LossConfig) and loss.name == "auto"):
        return None
    return loss.name


def step_of(cfg: TrainConfig) -> Callable[..., Any] | None:
    """The step function `step._target_` names, the model's own loss (`loss=from_model`), or
    None (model(input), then the loss)."""
    if isinstance(cfg.step, TargetFunctionConfig):
        return _call(cfg.step, "step")
    if isinstance(cfg.loss, FromModelLossConfig):
        from clorch.data.from_model import FromModelStep  # lazy: clorch.data imports torch

        return FromModelStep(cfg.loss.target_arg, cfg.loss.labels, cfg.loss.accuracy)
    return None


def _datasets_uncached(data: TargetDataConfig) -> tuple[Any, Any]:
    from clorch.data.user import check_map_style, hold_out  # lazy: clorch.data imports torch

    cls = resolve_target(data.target)
    kwargs = instantiate_nested(data.kwargs, "data")
    if takes(cls, "split"):
        train, held_out = cls(**kwargs, split="train"), cls(**kwargs, split="eval")
        check_map_style(train)
        check_map_style(held_out)
        return train, held_out
    whole = cls(**kwargs)
    check_map_style(whole)
    return hold_out(whole, data.eval_fraction)


@functools.lru_cache(maxsize=4)
def _datasets_cached(key: str) -> tuple[Any, Any]:
    return _datasets_uncached(TargetDataConfig(**json.loads(key)))


def user_datasets(data: TargetDataConfig) -> tuple[Any, Any]:
    """(train, eval) datasets of `data._target_` (built once per process for the same config).

    Raises:
        TypeError: not a map-style dataset, or its arguments do not fit.
        ValueError: holding out leaves no training samples; what the class raises.
    """
    return _datasets_cached(json.dumps(asdict(data), sort_keys=True, default=str))


def user_tasks(cfg: TrainConfig, device_type: str = "cpu") -> tuple[Any, Any]:
    """(train, eval) `DatasetTask`s of a `data._target_` config, loading for `device_type`."""
    from clorch.data.user import DatasetTask  # lazy: clorch.data imports torch

    data = cfg.data
    collate = None
    if data.collate_fn is not None:
        collate = _call(
            TargetFunctionConfig(
                target=data.collate_fn["_target_"], kwargs={k: v for k, v in data.collate_fn.items() if k != "_target_"}
            ),
            "data.collate_fn",
        )
    pin = device_type == "cuda" if data.pin_memory is None else data.pin_memory
    loader = {
        "collate_fn": collate,
        "num_workers": data.num_workers,
        "pin_memory": pin,
        "persistent_workers": data.persistent_workers,
        "prefetch_factor": data.prefetch_factor,
    }
    loss, step = loss_of(cfg), step_of(cfg)
    train, held_out = user_datasets(data)
    return (
        DatasetTask(train, loss=loss, step=step, seed=cfg.seed, **loader),
        DatasetTask(held_out, loss=loss, step=step, seed=cfg.seed, **loader),
    )


def build_splits(cfg: TrainConfig, device_type: str = "cpu") -> tuple[Any, Any]:
    """The train and eval splits of `cfg.data`: a built-in task, or your dataset as a DatasetTask."""
    if is_user_data(cfg):
        return user_tasks(cfg, device_type)
    from clorch.data.tasks import build_task  # lazy: clorch.data imports torch

    kwargs = data_kwargs(cfg)
    splits = (
        build_task(cfg.data.name, split="train", seed=cfg.seed, **kwargs),
        build_task(cfg.data.name, split="eval", seed=cfg.seed, **kwargs),
    )
    step = step_of(cfg)
    if step is None:
        return splits
    from clorch.data.from_model import SteppedTask  # lazy: clorch.data imports torch

    return SteppedTask(splits[0], step), SteppedTask(splits[1], step)


def split_sizes(cfg: TrainConfig) -> tuple[int, int]:
    """(train samples, eval samples), without building a built-in task's tensors."""
    if is_user_data(cfg):
        train, held_out = user_datasets(cfg.data)
        return len(train), len(held_out)
    from clorch.data.tasks import split_size  # lazy: clorch.data imports torch

    kwargs = data_kwargs(cfg)
    return (
        split_size(cfg.data.name, "train", cfg.seed, **kwargs),
        split_size(cfg.data.name, "eval", cfg.seed, **kwargs),
    )


def model_sizes_of(cfg: TrainConfig) -> dict[str, Any]:
    """The sizes the data gives the model (in_features, vocab_size, ...; a dataset of yours: those
    of its `model_kwargs()` method, if it has one)."""
    if is_user_data(cfg):
        from clorch.data.user import dataset_model_kwargs  # lazy: clorch.data imports torch

        return dataset_model_kwargs(user_datasets(cfg.data)[0])
    from clorch.data.tasks import model_sizes  # lazy: clorch.data imports torch

    return model_sizes(cfg.data.name, **data_kwargs(cfg))
