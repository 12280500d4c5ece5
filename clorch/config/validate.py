"""Validate a composed config against the schemas, collecting every error at once.

Nothing launches on a bad config: `check_config` returns a list of messages,
each naming the key, the value received and what is allowed, and
`ConfigError` carries them all.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import typing
from pathlib import Path
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from clorch.config import schema
from clorch.config.targets import find_targets, check_target

MODEL_FOR_DATA = {"synthetic": "mlp", "arithmetic": "gpt", "text": "gpt"}


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
        if key not in fields:
            errors.append(f"{full} is not a known key; allowed: {', '.join(fields)}")
            continue
        annotation = hints[key]
        if dataclasses.is_dataclass(annotation):
            if isinstance(value, Mapping):
                errors += check_section(f"{full}.", value, annotation)
            else:
                errors.append(f"{full} must be a mapping, got {value!r}")
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
        if "_target_" in values:
            continue  # a user class: its keys are its keyword arguments (target checked below)
        if isinstance(cls, dict):
            name = values.get("name")
            if name not in cls:
                errors.append(f"{group}={name!r} is not allowed; choose one of: {', '.join(cls)}")
                continue
            cls = cls[name]
        errors += check_section(f"{group}.", values, cls)
    top = {k: v for k, v in cfg.items() if k not in schema.GROUPS}
    return errors + check_section("", top, schema.TopConfig)


def _cross_errors(cfg: Mapping[str, Any]) -> list[str]:
    """Rules that involve more than one key; only run when the keys themselves are valid."""
    errors = []
    model, data, ckpt = cfg["model"], cfg["data"], cfg["checkpoint"]
    want = MODEL_FOR_DATA.get(data.get("name"))
    if want and model.get("name") != want and "_target_" not in model:
        errors.append(f"model={model.get('name')} cannot train data={data.get('name')}: "
                      f"use model={want}")
    if model.get("name") == "gpt" and model.get("d_model", 64) % model.get("n_head", 2):
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
    for where, target in find_targets(cfg):
        errors += check_target(where, target)
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
    if launcher.get("max_restarts", 0) > 0 and ckpt["policy"] != "periodic":
        errors.append(f"launcher.max_restarts={launcher['max_restarts']} resumes from the latest "
                      f"checkpoint: use checkpoint=periodic (got checkpoint={ckpt['policy']})")
    return errors


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
    errors = _group_errors(cfg)
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
