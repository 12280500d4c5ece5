"""The launch plan's checks of your own code and data, and of weights to start from, run before launch.

A dataset of yours is tried as the ranks will use it: its first items are
collated into a batch and one forward and loss run on the CPU, in the launching
process, with the model the config names, in train mode (as the ranks train). A model of yours on the built-in data
(or a step, or `loss=from_model`) is built on the meta device and runs one batch
of the data's shapes there (on the CPU where the meta device cannot serve). Under
`parallel=ddp` the trial also runs a backward: a trainable parameter that the loss
gives no gradient would stop every rank at its first step. A
`model.init_from` file is read and its keys and shapes compared with the model
built on the meta device. Each check returns error messages naming the key (and
the last line of your code in the traceback), so that the plan reports them with
every other error. They need torch, so `--cfg job` leaves them to the plan.
"""

from __future__ import annotations

import os
import re
import sysconfig
import traceback
from typing import Any, Mapping

from clorch.builders.data import build_splits, is_user_data, model_sizes_of, user_tasks
from clorch.builders.model import build_model_for, data_sized_defaults
from clorch.config.schema import FromModelLossConfig, TargetFunctionConfig, TargetModelConfig, TrainConfig
from clorch.config.targets import TargetBuildError, has_target
from clorch.config.layout import ParallelLayout
from clorch.plan.interrupted import reraise_interrupt

TRIAL_ITEMS = 2  # items collated for the trial batch (two, so that stacking is exercised)
_SHOWN = 5  # parameter names listed in an error; the count says how many there are in all
# Frames of these are not your code: an error is shown at the last frame outside them.
_LIBRARY_DIRS = tuple(
    os.path.join(os.path.realpath(d), "")
    for d in {sysconfig.get_paths()["stdlib"], os.path.dirname(os.path.dirname(__file__))}
)
_LIBRARY_PACKAGES = ("torch", "hydra", "omegaconf")


def _is_library(filename: str) -> bool:
    path = os.path.realpath(filename)
    if path.startswith(_LIBRARY_DIRS) or filename.startswith("<"):
        return True
    return any(f"{os.sep}{name}{os.sep}" in path and "-packages" in path for name in _LIBRARY_PACKAGES)


def _root(exc: BaseException) -> BaseException:
    """The exception a wrapper (Hydra's InstantiationException, TargetBuildError) was raised from."""
    while exc.__cause__ is not None and (
        isinstance(exc, TargetBuildError) or type(exc).__module__.startswith(("hydra", "omegaconf"))
    ):
        exc = exc.__cause__
    return exc


def _where(exc: BaseException) -> str:
    """`Type: message (at file:line in function)`: the last frame of your code (outside clorch,
    torch, Hydra and the standard library), else the innermost one, for a one-line error that
    shows where an assert without a message failed."""
    exc = _root(exc)
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if not _is_library(f.filename)]
    frame = (own or frames or [None])[-1]
    place = f" (at {frame.filename}:{frame.lineno} in {frame.name})" if frame else ""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else "(no message)"
    return f"{type(exc).__name__}: {message}{place}"


def _dict_hint(cfg: TrainConfig) -> str:
    """A hint for model arguments given as plain mappings, where the model may want an object."""
    kwargs = cfg.model.kwargs if isinstance(cfg.model, TargetModelConfig) else {}
    plain = [k for k, v in kwargs.items() if isinstance(v, Mapping) and not has_target(v)]
    if not plain:
        return ""
    return (
        f"; model.{plain[0]} is a plain mapping: if the model wants an object there, name its class "
        f"with model.{plain[0]}._target_=... (built first, with the other keys as its arguments)"
    )


def _model_key(cfg: TrainConfig) -> str:
    return (
        f"model._target_={cfg.model.target}" if isinstance(cfg.model, TargetModelConfig) else f"model={cfg.model.name}"
    )


def _built_key(cfg: TrainConfig, exc: BaseException) -> str:
    """The key of what failed to build: a nested object's (model.config._target_=...) or the model's."""
    if isinstance(exc, TargetBuildError):
        return str(exc).split(": building it raised")[0]
    return _model_key(cfg)


def _step_name(cfg: TrainConfig) -> str:
    if isinstance(cfg.step, TargetFunctionConfig):
        return f"step._target_={cfg.step.target}"
    if isinstance(cfg.loss, FromModelLossConfig):
        how = f"{cfg.loss.target_arg}=" if cfg.loss.target_arg else ""
        return f"loss=from_model (model(input, {how}{cfg.loss.labels}))"
    return "model(input) and the loss"


def user_data_errors(cfg: TrainConfig, layout: ParallelLayout) -> list[str]:
    """A dataset of yours whose first items do not collate, or whose batch does not fit the model
    and loss (one forward on the CPU; where the `layout` keeps the whole model on every rank, as
    parallel=ddp does, a backward too, `_trial_step`). Empty for the built-in data."""
    if not is_user_data(cfg):
        return []
    data = cfg.data
    train, _ = user_tasks(cfg, "cpu")
    if len(train) == 0:
        return [f"data._target_={data.target}: the training split is empty"]
    indices = list(range(min(TRIAL_ITEMS, len(train))))
    try:
        batch = train.batch(indices)
    except Exception as exc:  # the user's __getitem__ or collate_fn
        reraise_interrupt(exc)
        how = f"data.collate_fn._target_={data.collate_fn['_target_']}" if data.collate_fn else "default_collate"
        return [f"data._target_={data.target}: items {indices} do not make a batch with {how}: {_where(exc)}"]
    sizes = train.model_kwargs()
    try:
        model = build_model_for(cfg, sizes)
    except Exception as exc:
        reraise_interrupt(exc)
        return [
            f"{_built_key(cfg, exc)}: cannot be built for data._target_={data.target}: {_where(exc)}"
            f"{_dict_hint(cfg)}{_rejected_hint(cfg, exc)}{_sizes_hint(cfg, sizes)}"
        ]
    try:
        ungraded = _trial_step(cfg, train, model, batch, not layout.sharded)
    except Exception as exc:
        reraise_interrupt(exc)
        return [
            f"data._target_={data.target}: a batch of items {indices} does not fit {_step_name(cfg)} "
            f"(tried on the CPU before launch): {_where(exc)}{_sizes_hint(cfg, sizes)}"
        ]
    return _ungraded_errors(cfg, ungraded, f"a batch of data._target_={data.target}")


def _sizes_hint(cfg: TrainConfig, sizes: Mapping[str, Any]) -> str:
    """For a built-in model on a dataset of yours: the sizes the dataset's model_kwargs() did not
    give, which the model then took from its defaults (a shape error's usual cause)."""
    if isinstance(cfg.model, TargetModelConfig):
        return ""
    defaults = {k: v for k, v in data_sized_defaults(cfg).items() if k not in sizes}
    if not defaults:
        return ""
    names = ", ".join(defaults)
    taken = ", ".join(f"{k}={v}" for k, v in defaults.items())
    returned = ", ".join(f"{k!r}: ..." for k in defaults)
    return (
        f"; model={cfg.model.name} takes its sizes ({names}) from the dataset's model_kwargs(), and "
        f"data._target_={cfg.data.target} gives {'none' if not sizes else 'not these'}, so the model "
        f"was built with its defaults ({taken}): give the dataset a method "
        f"`def model_kwargs(self): return {{{returned}}}`, or name a model of your own with "
        "model._target_ and its arguments as model.* keys"
    )


def _rejected_hint(cfg: TrainConfig, exc: BaseException) -> str:
    """For a model of yours built through a factory's **kwargs (timm.create_model, from_pretrained):
    the model.* key that what it builds refused, by name."""
    root = _root(exc)
    found = re.search(r"unexpected keyword argument '(\w+)'", str(root))
    if not isinstance(cfg.model, TargetModelConfig) or not isinstance(root, TypeError) or not found:
        return ""
    name = found.group(1)
    if name not in cfg.model.kwargs:
        return ""
    return (
        f"; model.{name}={cfg.model.kwargs[name]!r} reaches {cfg.model.target} through its **kwargs, and "
        f"what it builds has no argument {name!r}: check the key's spelling against the model's "
        f"arguments, or remove model.{name}"
    )


def _needs_model_check(cfg: TrainConfig) -> bool:
    """Code of yours runs on the built-in data: a model of yours, a step, or the model's loss."""
    return not is_user_data(cfg) and (
        isinstance(cfg.model, TargetModelConfig)
        or isinstance(cfg.step, TargetFunctionConfig)
        or isinstance(cfg.loss, FromModelLossConfig)
    )


def _meta_batch(task: Any, indices: list[int]) -> Any:
    """A batch of the task's shape and dtypes on the meta device (no data is kept)."""
    import torch  # lazy: clorch-train --help and --cfg job import clorch.plan without torch

    batch = task.batch(indices)
    return {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _is_meta_gap(exc: BaseException) -> bool:
    """An operation the meta device cannot run (it reads values): retried on the CPU."""
    text = str(_root(exc)).lower()
    return isinstance(_root(exc), NotImplementedError) or "meta" in text


def user_model_errors(cfg: TrainConfig, layout: ParallelLayout) -> list[str]:
    """A model of yours (or a step, or the model's own loss) on the built-in data that cannot be
    built, or whose forward does not run on one batch of the data's shape (or, under
    parallel=ddp, whose backward leaves a trainable parameter without a gradient).

    The model is built on the meta device (no memory, no initialization time) and runs one
    batch of the data's shapes there. Where the meta device cannot serve (a factory that
    refuses it, as Hugging Face's from_pretrained does, or a forward that reads values) the
    model is built and run once on the CPU instead. `layout` is the plan's: a mode that keeps
    the whole model on every rank (clorch's reducer) needs every trainable parameter's gradient.
    """
    if not _needs_model_check(cfg):
        return []
    import torch  # lazy: clorch-train --help and --cfg job import clorch.plan without torch

    every = not layout.sharded
    sizes = model_sizes_of(cfg)
    train, _ = build_splits(cfg, "cpu")
    indices = list(range(min(TRIAL_ITEMS, len(train))))
    try:
        with torch.device("meta"):
            model = build_model_for(cfg, sizes)
    except Exception as exc:
        reraise_interrupt(exc)
        if not _is_meta_gap(exc):
            return [_build_error(cfg, exc)]
        return _on_the_cpu(cfg, sizes, train, indices, every)
    try:
        ungraded = _trial_step(cfg, train, model, _meta_batch(train, indices), every)
    except Exception as exc:
        reraise_interrupt(exc)
        if not _is_meta_gap(exc):
            return [_forward_error(cfg, exc)]
        return _on_the_cpu(cfg, sizes, train, indices, every)
    return _ungraded_errors(cfg, ungraded, f"a batch of data={cfg.data.name}")


def _on_the_cpu(cfg: TrainConfig, sizes: dict, train: Any, indices: list[int], every: bool) -> list[str]:
    """The model built and one real batch run on the CPU (where the meta device cannot serve)."""

    try:
        model = build_model_for(cfg, sizes)
    except Exception as exc:
        reraise_interrupt(exc)
        return [_build_error(cfg, exc)]
    try:
        ungraded = _trial_step(cfg, train, model, train.batch(indices), every)
    except Exception as exc:
        reraise_interrupt(exc)
        return [_forward_error(cfg, exc)]
    return _ungraded_errors(cfg, ungraded, f"a batch of data={cfg.data.name}")


def _trial_step(cfg: TrainConfig, train: Any, model: Any, batch: Any, every: bool) -> list[str]:
    """One batch's loss and, where `every` trainable parameter needs a gradient (parallel=ddp:
    clorch's reducer refuses a step in which one got none, so every rank would stop at its first
    step; a sharded mode steps without it), its backward: the names of the trainable parameters
    that got no gradient (none without a backward). Raises what your code raised.

    In train mode, as the ranks train, whatever mode the factory returned: a model whose
    forward differs by mode (torchvision's Inception adds auxiliary logits in train mode) is
    tried on the path it trains on. `model` is this check's own, built for it alone.
    """
    import torch  # lazy: clorch-train --help and --cfg job import clorch.plan without torch

    model.train()
    if not every:
        with torch.no_grad():
            train.loss(model, batch)
        return []
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    loss = train.loss(model, batch)
    if trainable and isinstance(loss, torch.Tensor) and loss.requires_grad:
        try:
            loss.backward()
        except Exception as exc:
            reraise_interrupt(exc)
            if _is_meta_gap(exc):  # not checked, rather than the whole model built on the CPU for it
                return []
            raise
    return [name for name, p in trainable if p.grad is None]


def _ungraded_errors(cfg: TrainConfig, ungraded: list[str], batch: str) -> list[str]:
    if not ungraded:
        return []
    shown = ", ".join(ungraded[:_SHOWN]) + (f", ... ({len(ungraded) - _SHOWN} more)" if len(ungraded) > _SHOWN else "")
    return [
        f"{_model_key(cfg)}: {len(ungraded)} trainable parameter(s) get no gradient from {batch} through "
        f"{_step_name(cfg)} (a backward tried before launch): {shown}; parallel=ddp needs a gradient for "
        "every trainable parameter at every step: remove them from the model, or freeze them "
        "(param.requires_grad_(False), e.g. in the model's __init__); parallel=fsdp allows them"
    ]


def _build_error(cfg: TrainConfig, exc: BaseException) -> str:
    return (
        f"{_built_key(cfg, exc)}: cannot be built (tried before launch): {_where(exc)}"
        f"{_dict_hint(cfg)}{_rejected_hint(cfg, exc)}"
    )


def _forward_error(cfg: TrainConfig, exc: BaseException) -> str:
    hint = ""
    if _step_name(cfg) == "model(input) and the loss":
        hint = " (if the model returns its own loss, as nanoGPT's and Hugging Face's do: loss=from_model)"
    return (
        f"{_model_key(cfg)}: a batch of data={cfg.data.name} (shape of {TRIAL_ITEMS} samples) does not "
        f"run through {_step_name(cfg)} (tried before launch): {_where(exc)}{hint}"
    )


def init_from_errors(cfg: TrainConfig) -> list[str]:
    """A `model.init_from` file that is missing, unreadable, or does not fit the model."""
    path = getattr(cfg.model, "init_from", None)
    if path is None:
        return []
    import torch  # lazy: clorch-train --help and --cfg job import clorch.plan without torch

    from clorch.checkpoint.weights import fit_errors, open_weights  # lazy: imports torch

    try:  # names and shapes only: the launching process reads no tensor of the file
        with open_weights(path) as stored:
            weights = stored.specs()
    except (OSError, ValueError, TypeError) as exc:
        return [f"model.init_from={path!r}: {exc}"]
    try:
        sizes = model_sizes_of(cfg)  # on the host: a task may draw samples
        with torch.device("meta"):
            model = build_model_for(cfg, sizes)
    except Exception as exc:  # reported by the data and model checks; nothing to compare against
        reraise_interrupt(exc)
        return []
    return fit_errors(model, weights, strict=cfg.model.init_strict, key=f"model.init_from={path}")
