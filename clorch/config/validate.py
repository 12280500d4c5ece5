"""Validate a composed config against the schemas, collecting every error at once.

Nothing launches on a bad config: `check_config` returns a list of messages,
each naming the key, the value received and what is allowed, and
`ConfigError` carries them all.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import math
import os
import re
import typing
from pathlib import Path
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from clorch.config import schema
from clorch.config.targets import check_target, find_targets, resolve_target

MODEL_FOR_DATA = {"synthetic": "mlp", "arithmetic": "gpt", "text": "gpt"}
# Step checkpoints as clorch.checkpoint.step_checkpoint_path names them.
_STEP_CHECKPOINT = re.compile(r"step_\d{8,}\.ckpt")


class ConfigError(ValueError):
    """One or more config errors; `.errors` holds every message."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        lines = "\n".join(f"  - {e}" for e in self.errors)
        super().__init__(f"{len(self.errors)} config error(s):\n{lines}")


def _type_name(annotation: Any) -> str:
    if annotation is type(None):
        return "null"
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Union:
        return " or ".join(_type_name(a) for a in args)
    if typing.get_origin(annotation) is list:
        return f"a list of {_type_name(args[0])}"
    return getattr(annotation, "__name__", str(annotation))


def _matches(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin is typing.Union:
        return any(_matches(value, a) for a in typing.get_args(annotation))
    if origin is list:
        (inner,) = typing.get_args(annotation)
        return isinstance(value, (list, tuple)) and all(_matches(v, inner) for v in value)
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


def _non_finite(value: Any) -> bool:
    """Whether `value` is or holds inf or nan (JSON and the engine cannot carry them)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return any(_non_finite(v) for v in value)
    if isinstance(value, Mapping):
        return any(_non_finite(v) for v in value.values())
    return False


def _rule_errors(key: str, value: Any, meta: Mapping[str, Any]) -> list[str]:
    if "choices" in meta and value not in meta["choices"]:
        allowed = ", ".join("null" if c is None else str(c) for c in meta["choices"])
        return [f"{key}={value!r} is not allowed; choose one of: {allowed}"]
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return []
    for name, test, words in (("gt", lambda v, b: v > b, "> "), ("ge", lambda v, b: v >= b, ">= "),
                              ("lt", lambda v, b: v < b, "< "), ("le", lambda v, b: v <= b, "<= ")):
        if name in meta and not test(value, meta[name]):
            unit = f" ({meta['unit']})" if "unit" in meta else ""
            return [f"{key} must be {words}{meta[name]}{unit}, got {value!r}"]
    return []


def check_section(prefix: str, values: Mapping[str, Any], cls: type) -> list[str]:
    """Check one section against its dataclass: unknown keys, types, rules."""
    errors = []
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in values.items():
        full = f"{prefix}{key}"
        if key == "_target_":
            continue  # reported by _target_errors
        if key not in fields:
            errors.append(f"{full} is not a known key; allowed: {', '.join(fields)}")
            continue
        annotation = hints[key]
        if dataclasses.is_dataclass(annotation):
            if isinstance(value, Mapping):
                errors += check_section(f"{full}.", value, annotation)
            else:
                errors.append(f"{full} must be a mapping, got {value!r}")
        elif _non_finite(value):
            what = "hold only finite numbers" if isinstance(value, (list, tuple)) else "be a finite number"
            errors.append(f"{full} must {what}, got {value!r}")
        elif not _matches(value, annotation):
            errors.append(f"{full} must be {_type_name(annotation)}, got {value!r}")
        else:
            errors += _rule_errors(full, value, fields[key].metadata)
    return errors


def _group_errors(cfg: Mapping[str, Any]) -> list[str]:
    errors = []
    for group, cls in schema.GROUPS.items():
        values = cfg.get(group)
        if not isinstance(values, Mapping):
            errors.append(f"{group} must be a config group (mapping), got {values!r}")
            continue
        if group == "model" and "_target_" in values:
            errors += _user_model_errors(values)
            continue
        if isinstance(cls, dict):
            name = values.get("name")
            if name not in cls:
                errors.append(f"{group}={name!r} is not allowed; choose one of: {', '.join(cls)}")
                continue
            cls = cls[name]
        errors += check_section(f"{group}.", values, cls)
    top = {k: v for k, v in cfg.items() if k not in schema.GROUPS}
    return errors + check_section("", top, schema.TopConfig)


def _user_model_errors(values: Mapping[str, Any]) -> list[str]:
    """A model with `_target_`: its other keys are the target's keyword arguments.

    `name` is ignored; null values are left out (the data fills its sizes), as
    clorch.engine.components.build_raw_model does.
    """
    errors = [f"model.{k} must be a finite number, got {v!r}" for k, v in values.items() if _non_finite(v)]
    target = values["_target_"]
    if check_target("model._target_", target):
        return errors  # reported by _target_errors
    try:
        parameters = inspect.signature(resolve_target(target)).parameters.values()
    except (TypeError, ValueError):
        return errors  # no signature to check against (a builtin)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return errors
    names = [p.name for p in parameters
             if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    for key, value in values.items():
        if key not in ("_target_", "name") and value is not None and key not in names:
            errors.append(f"model.{key}={value!r} is not an argument of model._target_={target}; "
                          f"its arguments: {', '.join(names)} (remove it with ~model.{key})")
    return errors


def _target_errors(cfg: Mapping[str, Any]) -> list[str]:
    """The allow-list for model._target_; a `_target_` anywhere else is an error."""
    errors = []
    for where, target in find_targets(cfg):
        if where == "model._target_":
            errors += check_target(where, target)
        else:
            errors.append(f"{where} is not supported: only model._target_ is honoured "
                          f"(got {where}={target!r}; remove it)")
    return errors


def _cross_errors(cfg: Mapping[str, Any]) -> list[str]:
    """Rules that involve more than one key; only run when the keys themselves are valid."""
    errors = []
    model, data, ckpt = cfg["model"], cfg["data"], cfg["checkpoint"]
    want = MODEL_FOR_DATA.get(data.get("name"))
    if want and model.get("name") != want and "_target_" not in model:
        errors.append(f"model={model.get('name')} cannot train data={data.get('name')}: "
                      f"use model={want}")
    if model.get("name") == "gpt" and "_target_" not in model \
            and model.get("d_model", 64) % model.get("n_head", 2):
        errors.append(f"model.d_model ({model.get('d_model')}) must be divisible by "
                      f"model.n_head ({model.get('n_head')})")
    if data.get("name") == "text":
        path = data.get("path")
        if path is None:
            errors.append("data.path is required for data=text: name a UTF-8 file")
        elif not Path(path).expanduser().is_file():
            errors.append(f"data.path={path!r} does not exist or is not a file")
    errors += _checkpoint_errors(ckpt, cfg["launcher"])
    if cfg["precision"]["name"] == "fp16" and not cfg["precision"]["scaler"].get("enabled", True):
        errors.append("precision.scaler.enabled=false with precision=fp16 risks underflow: "
                      "keep the scaler on for fp16 (use bf16 for no scaler)")
    if cfg["logger"].get("tensorboard") and importlib.util.find_spec("tensorboard") is None:
        errors.append("logger=tensorboard needs the tensorboard package: "
                      "pip install 'clorch[tensorboard]' (or use logger=jsonl)")
    return errors


def _checkpoint_errors(ckpt: Mapping[str, Any], launcher: Mapping[str, Any]) -> list[str]:
    errors = []
    resume = ckpt.get("resume", "none")
    if ckpt["policy"] == "periodic" and ckpt.get("every_n_steps", 0) < 1:
        errors.append(f"checkpoint.every_n_steps must be >= 1 with checkpoint=periodic, "
                      f"got {ckpt.get('every_n_steps')}")
    if resume == "latest" and ckpt.get("dir") is None:
        errors.append("checkpoint.resume=latest needs checkpoint.dir (the directory of the run "
                      "to resume), got null")
    elif resume not in ("none", "latest") and not Path(resume).expanduser().exists():
        errors.append(f"checkpoint.resume={resume!r}: no such checkpoint "
                      "(allowed: none, latest, or an existing checkpoint path)")
    if resume == "none" and ckpt["policy"] == "periodic" and ckpt.get("dir") is not None:
        errors += reused_dir_errors("checkpoint.dir", ckpt["dir"])
    if launcher.get("max_restarts", 0) > 0 and ckpt["policy"] != "periodic":
        errors.append(f"launcher.max_restarts={launcher['max_restarts']} resumes from the latest "
                      f"checkpoint: use checkpoint=periodic (got checkpoint={ckpt['policy']})")
    return errors


def reused_dir_errors(key: str, directory: str | os.PathLike) -> list[str]:
    """An error when a new run would write step checkpoints beside an earlier run's.

    Pruning keeps the highest step numbers and resume=latest takes the highest,
    so the two runs' checkpoints would mix. Only the launching process checks
    this, before launch: the launcher's restarts (CLORCH_RESTART_COUNT > 0)
    resume from the job's own checkpoints and are not refused.
    """
    if int(os.environ.get("CLORCH_RESTART_COUNT", "0") or 0) > 0:
        return []
    path = Path(directory).expanduser()
    found = sorted(p.name for p in path.iterdir() if _STEP_CHECKPOINT.fullmatch(p.name)) \
        if path.is_dir() else []
    if not found:
        return []
    shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
    return [f"{key}={str(directory)} already holds checkpoints ({shown}); pass "
            "checkpoint.resume=latest to continue that run, or choose an empty directory"]


def check_config(cfg: DictConfig | Mapping[str, Any]) -> list[str]:
    """Every error in the config, or an empty list.

    Checks unknown keys, types, ranges and choices of every group against
    `clorch.config.schema`, then the rules across keys (model/data fit, the
    checkpoint policy, paths that must exist, `_target_` allow-list).
    """
    if isinstance(cfg, DictConfig):
        try:
            cfg = OmegaConf.to_container(cfg, resolve=True)
        except Exception as exc:  # an interpolation that does not resolve
            return [f"the config does not resolve: {exc}"]
    errors = _group_errors(cfg) + _target_errors(cfg)
    try:
        errors += _cross_errors(cfg)
    except (KeyError, TypeError, AttributeError):
        pass  # a malformed section already has its own error above
    return errors


def validate(cfg: DictConfig | Mapping[str, Any]) -> None:
    """Raise `ConfigError` with every error found by `check_config`."""
    errors = check_config(cfg)
    if errors:
        raise ConfigError(errors)
