"""Checks of the config sections that name your own code with `_target_`.

`model._target_`, `data._target_` (and `data.collate_fn._target_`), `loss._target_`
and `step._target_` may name a class or function of a trusted module
(`clorch.config.targets`). Each target is imported once here, before launch, and
the section's other keys are bound against its signature, so that a misspelt
argument is a config error naming the key, not a crash in every rank.

What clorch calls, and so which arguments the config may not give:

    model      Class(**kwargs, plus the data's sizes it names)
    data       Class(**kwargs, split="train" | "eval" when it takes `split`)
    collate_fn fn(list_of_items, **kwargs)
    loss       fn(outputs, targets, **kwargs)
    step       fn(model, batch, **kwargs) -> loss, or (loss, {metric: value})
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Mapping

from clorch.config import schema
from clorch.config.fields import check_section, did_you_mean, non_finite
from clorch.config.targets import check_target, resolve_target

# Target key -> the arguments clorch passes itself (positionally or by name).
CALLED_WITH = {
    "model._target_": (),
    "data._target_": ("split",),
    "data.collate_fn._target_": ("batch",),
    "loss._target_": ("outputs", "targets"),
    "step._target_": ("model", "batch"),
}
TARGET_KEYS = tuple(CALLED_WITH)


def _own_keys(group: str) -> type:
    """A dataclass of just the keys clorch reads in a `_target_` section of `group`."""
    cls = schema.TARGET_SCHEMAS[group]
    own = [(f.name, f.type, f) for f in dataclasses.fields(cls) if f.name not in ("target", "kwargs", "name")]
    keys = dataclasses.make_dataclass(cls.__name__, own)
    keys.__module__ = cls.__module__  # its annotations are names in the schema module
    return keys


def own_key_errors(group: str, values: Mapping[str, Any]) -> list[str]:
    """Type and range errors of the keys clorch reads in a `_target_` section (init_from, num_workers, ...)."""
    keys = _own_keys(group)
    own = {f.name for f in dataclasses.fields(keys)}
    errors = check_section(f"{group}.", {k: v for k, v in values.items() if k in own}, keys)
    return [e for e in errors if " is missing " not in e]  # optional here: each has a default


def parameters(target: Any) -> list[inspect.Parameter] | None:
    """The target's parameters, or None when it has no signature to read (some builtins)."""
    try:
        return list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return None


def keyword_names(params: list[inspect.Parameter]) -> list[str]:
    return [
        p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]


def takes(target: Any, name: str) -> bool:
    """Whether `target` accepts the keyword argument `name` (explicitly or through **kwargs)."""
    params = parameters(target)
    if params is None:
        return False
    return name in keyword_names(params) or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def names(target: Any, name: str) -> bool:
    """Whether `target`'s signature names the argument `name` itself (not through **kwargs)."""
    params = parameters(target)
    return params is not None and name in keyword_names(params)


def argument_errors(where: str, target_path: str, kwargs: Mapping[str, Any]) -> list[str]:
    """Errors for config keys that are not arguments of the target at `where` ("loss._target_")."""
    section = where.rsplit("._target_", 1)[0]
    errors = [f"{section}.{k} must be a finite number, got {v!r}" for k, v in kwargs.items() if non_finite(v)]
    params = parameters(resolve_target(target_path))
    if params is None or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return errors
    names = keyword_names(params)
    passed = CALLED_WITH[where]
    for key, value in kwargs.items():
        if value is None:
            continue
        if key in passed:
            errors.append(
                f"{section}.{key} is passed by clorch (it calls {_call_shape(where)}); remove it with ~{section}.{key}"
            )
        elif key not in names:
            free = [n for n in names if n not in passed]
            errors.append(
                f"{section}.{key}={value!r} is not an argument of {where}={target_path}; "
                f"{did_you_mean(key, free)}its arguments: {', '.join(free) or 'none'} "
                f"(remove it with ~{section}.{key})"
            )
    return errors


def _call_shape(where: str) -> str:
    shapes = {
        "model._target_": "Class(**its keys)",
        "data._target_": "Class(**its keys, split=...)",
        "data.collate_fn._target_": "fn(items, **its keys)",
        "loss._target_": "fn(outputs, targets, **its keys)",
        "step._target_": "fn(model, batch, **its keys)",
    }
    return shapes[where]


def target_section_errors(group: str, values: Mapping[str, Any]) -> list[str]:
    """Every error of a group section that names `_target_` (the target itself is checked by
    `clorch.config.checks`' allow-list pass; a refused one is not imported here)."""
    errors = own_key_errors(group, values)
    target = values["_target_"]
    if check_target(f"{group}._target_", target):
        return errors
    section = schema.target_section(group, {k: v for k, v in values.items()})
    errors += argument_errors(f"{group}._target_", target, section.kwargs)
    collate = values.get("collate_fn") if group == "data" else None
    if isinstance(collate, Mapping):
        if "_target_" not in collate:
            errors.append(
                f"data.collate_fn must name a function with _target_, got {dict(collate)!r} "
                "(e.g. data.collate_fn._target_=my_project.data.collate)"
            )
        elif not check_target("data.collate_fn._target_", collate["_target_"]):
            errors += argument_errors(
                "data.collate_fn._target_", collate["_target_"], {k: v for k, v in collate.items() if k != "_target_"}
            )
    return errors


def cross_errors(cfg: Any) -> list[str]:
    """The loss and step keys against the data they train on (run on the valid sections)."""
    data, loss, step = cfg.data, cfg.loss, cfg.step
    if data is None or loss is None or step is None:
        return []
    own_data = isinstance(data, schema.TargetDataConfig)
    from_model = isinstance(loss, schema.FromModelLossConfig)
    # an option that computes the built-in data's own loss another way (loss=chunked_cross_entropy) is no loss of yours
    own_loss = not (isinstance(loss, schema.LossConfig) and loss.name == "auto") and not loss.for_built_in_data
    own_step = isinstance(step, schema.TargetFunctionConfig)
    errors = []
    if own_data and not own_loss and not own_step:
        errors.append(
            f"data._target_={data.target} needs a loss: loss=cross_entropy (integer class "
            "targets), loss=mse, loss=from_model (the model returns its own loss), "
            "loss._target_=my_project.losses.fn (called fn(outputs, targets)), "
            "or step._target_=my_project.train.step (called fn(model, batch))"
        )
    if not own_data and own_loss and not from_model and not own_step:
        what = f"loss._target_={loss.target}" if hasattr(loss, "target") else f"loss={loss.name}"
        errors.append(
            f"{what} applies to a dataset of your own (data._target_): data={data.name} "
            "trains with its own loss; drop it, use loss=from_model (the model's own loss) or "
            "step._target_ (called fn(model, batch)), or name your dataset with data._target_"
        )
    if from_model and cfg.model is not None and not isinstance(cfg.model, schema.TargetModelConfig):
        errors.append(
            f"loss=from_model takes the loss the model returns, and model={cfg.model.name} returns "
            "only its outputs: name a model that computes its own loss with model._target_, or "
            "drop loss=from_model"
        )
    if own_step and own_loss:
        errors.append(
            f"step._target_={step.target} computes the loss itself: loss="
            f"{getattr(loss, 'target', getattr(loss, 'name', '?'))} would be ignored; drop the loss key"
        )
    if own_data and data.num_workers == 0 and (data.persistent_workers or data.prefetch_factor is not None):
        key = "persistent_workers" if data.persistent_workers else "prefetch_factor"
        errors.append(
            f"data.{key}={getattr(data, key)!r} needs worker processes: set data.num_workers >= 1 "
            f"(got data.num_workers=0)"
        )
    return errors
