"""Validate a composed config against the schemas, collecting every error at once.

Nothing launches on a bad config: `check_config` returns a list of messages,
each naming the key, the value received and what is allowed, and
`ConfigError` carries them all.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import inspect
import math
import os
import typing
from pathlib import Path
from typing import Any, Iterable, Mapping

from omegaconf import DictConfig, OmegaConf

from clorch.config import schema
from clorch.config.composer import format_value
from clorch.config.targets import check_target, find_targets, resolve_target
from clorch.env import restart_count

MODEL_FOR_DATA = {"synthetic": "mlp", "arithmetic": "gpt", "text": "gpt"}


EXIT_STATUS = 2
"""The exit status of a command that stopped on config errors (nothing was launched)."""


def print_config_errors(errors: list[str]) -> None:
    """Print every config error to stderr, as `clorch-train` reports them."""
    import sys

    print(f"clorch-train: {len(errors)} config error(s); nothing was launched:", file=sys.stderr)
    for error in errors:
        print(f"  - {error}", file=sys.stderr)


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
    if typing.get_origin(annotation) is typing.Literal:
        return "one of " + ", ".join(_shown(a) for a in args)
    if typing.get_origin(annotation) is typing.Union:
        return " or ".join(_type_name(a) for a in args)
    if typing.get_origin(annotation) is list:
        return f"a list of {_type_name(args[0])}"
    return getattr(annotation, "__name__", str(annotation))


def _shown(value: Any) -> str:
    return "null" if value is None else str(value)


def _literals(annotation: Any) -> tuple[Any, ...]:
    """The values a Literal annotation allows (also inside Optional/Union), else ()."""
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Union:
        return tuple(v for a in typing.get_args(annotation) for v in _literals(a))
    return ()


def _matches(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return any(value == a and type(value) is type(a) for a in typing.get_args(annotation))
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
    if isinstance(value, (list, tuple)) and "length" in meta:
        if len(value) != meta["length"] or _rule_errors(key, value, meta["items"]) \
                or any(_rule_errors(key, v, meta["items"]) for v in value):
            return [f"{key} must be {meta['length']} numbers {meta['words']}, got {list(value)!r}"]
        return []
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return []
    for name, test, words in (("gt", lambda v, b: v > b, "> "), ("ge", lambda v, b: v >= b, ">= "),
                              ("lt", lambda v, b: v < b, "< "), ("le", lambda v, b: v <= b, "<= ")):
        if name in meta and not test(value, meta[name]):
            unit = f" ({meta['unit']})" if "unit" in meta else ""
            return [f"{key} must be {words}{meta[name]}{unit}, got {value!r}"]
    return []


def _did_you_mean(key: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f"did you mean {close[0]}? " if close else ""


def _unknown_key(prefix: str, key: str, fields: Mapping[str, Any], owner: str | None,
                 siblings: Mapping[str, type]) -> str:
    """The error for a key the schema does not have, naming the option it belongs to if any."""
    full, allowed = f"{prefix}{key}", ", ".join(fields)
    if owner is not None:
        group, option = owner.split("=")
        others = [name for name, cls in siblings.items()
                  if name != option and key in {f.name for f in dataclasses.fields(cls)}]
        if others:
            return (f"{full} is not a key of {owner} (it belongs to {group}={' / '.join(others)}); "
                    f"{owner} takes: {allowed}")
    return f"{full} is not a known key; {_did_you_mean(key, fields)}allowed: {allowed}"


def _value_errors(full: str, value: Any, annotation: Any, meta: Mapping[str, Any]) -> list[str]:
    if _non_finite(value):
        what = "hold only finite numbers" if isinstance(value, (list, tuple)) else "be a finite number"
        return [f"{full} must {what}, got {value!r}"]
    choices = _literals(annotation)
    members = typing.get_args(annotation) if typing.get_origin(annotation) is typing.Union else ()
    others = [f"an {_type_name(a)}".replace("an int", "an integer") for a in members
              if typing.get_origin(a) is not typing.Literal and a is not type(None)]
    if choices and others and (not _matches(value, annotation) or _rule_errors(full, value, meta)):
        # One wording whatever is wrong: `auto` or an integer >= 1, for 0 and for "many" alike.
        bound = next((f" {words}{meta[name]}" for name, words in
                      (("gt", "> "), ("ge", ">= "), ("lt", "< "), ("le", "<= ")) if name in meta), "")
        shown = " or ".join(_shown(c) for c in choices)
        return [f"{full} must be {shown} or {' or '.join(others)}{bound}, got {value!r}"]
    if choices and not _matches(value, annotation):
        allowed = ", ".join(_shown(c) for c in choices) + "".join(f", or {o}" for o in others)
        return [f"{full}={value!r} is not allowed; choose one of: {allowed}"]
    if not _matches(value, annotation):
        return [f"{full} must be {_type_name(annotation)}, got {value!r}"]
    return _rule_errors(full, value, meta)


def check_section(prefix: str, values: Mapping[str, Any], cls: type, owner: str | None = None,
                  siblings: Mapping[str, type] | None = None) -> list[str]:
    """Check one section against its dataclass: unknown and missing keys, types, rules.

    Args:
        prefix: the section's key path with a trailing dot ("optim."), or "" at the top.
        values: the section's values.
        cls: its schema dataclass.
        owner: "group=option" the section is (named in errors), or None.
        siblings: the group's other options' schemas, to say which option a stray key belongs to.
    """
    errors = []
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in values.items():
        full = f"{prefix}{key}"
        if key == "_target_":
            continue  # reported by _target_errors
        if key not in fields:
            errors.append(_unknown_key(prefix, key, fields, owner, siblings or {}))
            continue
        annotation = hints[key]
        if dataclasses.is_dataclass(annotation):
            if isinstance(value, Mapping):
                errors += check_section(f"{full}.", value, annotation)
            else:
                errors.append(f"{full} must be a mapping, got {value!r}")
        else:
            errors += _value_errors(full, value, annotation, fields[key].metadata)
    for key, f in fields.items():
        if key not in values:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            shown = dataclasses.asdict(default) if dataclasses.is_dataclass(default) else default
            where = f" of {owner}" if owner else ""
            errors.append(f"{prefix}{key} is missing (removed with ~{prefix}{key}?): every key{where} "
                          f"needs a value; its default is {format_value(shown)}")
    return errors


def _option_of(group: str, values: Mapping[str, Any]) -> tuple[str | None, list[str]]:
    """(the option a group section is, or None with an error)."""
    options = schema.OPTIONS[group]
    selector = schema.SELECTOR.get(group, "name")
    if not hasattr(next(iter(options.values())), selector):  # one option, no key naming it
        return next(iter(options)), []
    option = values.get(selector)
    if option in options:
        return option, []
    return None, [f"{group}={option!r} is not allowed; choose one of: {', '.join(sorted(options))}"]


def _group_errors(cfg: Mapping[str, Any]) -> tuple[list[str], set[str]]:
    """(every error in the groups and top-level keys, the groups and "top" that have errors)."""
    errors, bad = [], set()
    for group in schema.OPTIONS:
        before = len(errors)
        _check_group(cfg, group, errors)
        if len(errors) > before:
            bad.add(group)
    top = {k: v for k, v in cfg.items() if k not in schema.OPTIONS}
    unknown, known_errors = _top_errors(top)
    if known_errors:  # an unknown top-level key leaves the known ones usable
        bad.add("top")
    return errors + unknown + known_errors, bad


def _check_group(cfg: Mapping[str, Any], group: str, errors: list[str]) -> None:
    """Append the errors of one group section to `errors`."""
    if True:
        values = cfg.get(group)
        if not isinstance(values, Mapping):
            errors.append(f"{group} must be a config group (mapping), got {values!r}"
                          if group in cfg else f"{group} is missing: choose one of "
                          f"{', '.join(sorted(schema.OPTIONS[group]))} ({group}=OPTION)")
            return
        if group == "model" and "_target_" in values:
            errors += _user_model_errors(values)
            return
        option, problems = _option_of(group, values)
        if option is None:
            errors += problems
            return
        errors += check_section(f"{group}.", values, schema.option_schemas(group)[option],
                                owner=f"{group}={option}", siblings=schema.option_schemas(group))


def _top_errors(top: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(errors for unknown top-level keys, errors in TopConfig's keys)."""
    known = [f.name for f in dataclasses.fields(schema.TopConfig)]
    groups = sorted(schema.OPTIONS)
    errors = []
    for key in top:
        if key not in known:
            allowed = ", ".join([*known, *(f"{g} (group)" for g in groups)])
            nested = _group_keys_named(key)
            hint = (f"did you mean {' or '.join(nested)}? " if nested
                    else _did_you_mean(key, [*known, *groups]))
            errors.append(f"{key} is not a known key; {hint}allowed: {allowed}")
    return errors, check_section("", {k: v for k, v in top.items() if k in known}, schema.TopConfig)


def _group_keys_named(key: str) -> list[str]:
    """`group.key` for every group with an option that has `key` (sample_count -> data.sample_count)."""
    return [f"{group}.{key}" for group, options in sorted(schema.OPTIONS.items())
            if any(key in {f.name for f in dataclasses.fields(type(o))} for o in options.values())]


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


def _cross_errors(cfg: schema.TrainConfig) -> list[str]:
    """Rules that involve more than one key (run once every key is valid on its own)."""
    errors = []
    model, data = cfg.model, cfg.data
    want = MODEL_FOR_DATA.get(getattr(data, "name", None))
    if want and model is not None and model.name != want \
            and not isinstance(model, schema.TargetModelConfig):
        errors.append(f"model={model.name} cannot train data={data.name}: use model={want}")
    if isinstance(model, schema.GPTConfig) and model.d_model % model.n_head:
        errors.append(f"model.d_model ({model.d_model}) must be divisible by "
                      f"model.n_head ({model.n_head})")
    if isinstance(data, schema.TextDataConfig):
        if data.path is None:
            errors.append("data.path is required for data=text: name a UTF-8 file")
        elif not Path(data.path).expanduser().is_file():
            errors.append(f"data.path={data.path!r} does not exist or is not a file")
    if cfg.checkpoint is not None and cfg.launcher is not None:
        errors += _checkpoint_errors(cfg.checkpoint, cfg.launcher)
    if isinstance(cfg.launcher, schema.TorchrunLauncherConfig):
        errors += _nnodes_errors(cfg.launcher)
    if isinstance(cfg.precision, schema.FP16Config) and not cfg.precision.scaler.enabled:
        errors.append("precision.scaler.enabled=false with precision=fp16 risks underflow: "
                      "keep the scaler on for fp16 (use bf16 for no scaler)")
    if isinstance(cfg.precision, schema.FP16Config) and cfg.ddp is not None and cfg.ddp.step_in_backward:
        errors.append("ddp.step_in_backward=true cannot run with precision=fp16: the loss scaler decides "
                      "to skip a step only after every gradient is in, and backward would already have "
                      "stepped (use precision=bf16 or fp32, or ddp.step_in_backward=false)")
    if cfg.compile and cfg.compile_mode in schema.CUDA_GRAPH_MODES and cfg.accumulation > 1:
        errors.append(f"compile_mode={cfg.compile_mode} replays CUDA graphs, which reuse their output memory "
                      f"at every forward, so gradients cannot accumulate over micro-batches (got "
                      f"accumulation={cfg.accumulation}): use accumulation=1, or compile_mode=default or "
                      "max-autotune-no-cudagraphs")
    if cfg.logger is not None and cfg.logger.tensorboard and importlib.util.find_spec("tensorboard") is None:
        errors.append("logger=tensorboard needs the tensorboard package: "
                      "pip install tensorboard (in a clorch checkout: pip install '.[tensorboard]'), "
                      "or use logger=jsonl")
    return errors


def _nnodes_errors(launcher: Any) -> list[str]:
    """launcher.nnodes for torchrun: N or "MIN:MAX" with 1 <= MIN <= MAX."""
    value = launcher.nnodes
    text = str(value)
    parts = text.split(":")
    try:
        low, high = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (0, -1)
    except ValueError:
        low, high = 0, -1
    if isinstance(value, bool) or not 1 <= low <= high:
        return [f"launcher.nnodes={value!r} is not allowed; give a node count >= 1 or a range "
                f"MIN:MAX with 1 <= MIN <= MAX (e.g. 2 or 1:4)"]
    return []


def _checkpoint_errors(ckpt: schema.CheckpointConfig, launcher: Any) -> list[str]:
    errors = []
    if ckpt.policy == "periodic" and ckpt.every_n_steps < 1:
        errors.append(f"checkpoint.every_n_steps must be >= 1 with checkpoint=periodic, "
                      f"got {ckpt.every_n_steps}")
    if ckpt.resume == "latest" and ckpt.dir is None:
        errors.append("checkpoint.resume=latest needs checkpoint.dir (the directory of the run "
                      "to resume), got null")
    elif ckpt.resume not in ("none", "latest") and not Path(ckpt.resume).expanduser().exists():
        errors.append(f"checkpoint.resume={ckpt.resume!r}: no such checkpoint "
                      "(allowed: none, latest, or an existing checkpoint path)")
    if ckpt.resume == "none" and ckpt.policy == "periodic" and ckpt.dir is not None:
        errors += reused_dir_errors("checkpoint.dir", ckpt.dir)
    if launcher.max_restarts > 0 and ckpt.policy != "periodic":
        errors.append(f"launcher.max_restarts={launcher.max_restarts} resumes from the latest "
                      f"checkpoint: use checkpoint=periodic (got checkpoint={ckpt.policy})")
    return errors


def reused_dir_errors(key: str, directory: str | os.PathLike) -> list[str]:
    """An error when a new run would write step checkpoints beside an earlier run's.

    Pruning keeps the highest step numbers and resume=latest takes the highest,
    so the two runs' checkpoints would mix. Only the launching process checks
    this, before launch: the launcher's restarts (CLORCH_RESTART_COUNT > 0)
    resume from the job's own checkpoints and are not refused.
    """
    if restart_count() > 0:
        return []
    from clorch.checkpoint.policy import step_checkpoints

    found = sorted(path.name for _, path in step_checkpoints(Path(directory).expanduser()))
    if not found:
        return []
    shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
    return [f"{key}={str(directory)} already holds checkpoints ({shown}); pass "
            "checkpoint.resume=latest to continue that run, or choose an empty directory"]


def to_plain(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    """Plain containers with interpolations resolved.

    Raises:
        ConfigError: an interpolation does not resolve.
    """
    if not isinstance(cfg, DictConfig):
        return dict(cfg)
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception as exc:  # an interpolation that does not resolve
        raise ConfigError([f"the config does not resolve: {exc}"]) from None


def checked(cfg: DictConfig | Mapping[str, Any]) -> tuple[schema.TrainConfig | None, list[str]]:
    """(the typed config, or None, and every error in the config).

    Checks unknown and missing keys, types, ranges and choices of every group
    against `clorch.config.schema`, the `_target_` allow-list, then the rules
    across keys (model/data fit, the checkpoint policy, paths that must exist).
    """
    typed, errors = checked_partial(cfg)
    return (typed, []) if not errors else (None, errors)


def checked_partial(cfg: DictConfig | Mapping[str, Any]) -> tuple[Any, list[str]]:
    """(a TrainConfig, or a `Partial` of its good sections, or None; every error).

    None only when the config does not resolve at all; later checks (the launch
    plan) judge what the good sections allow.
    """
    try:
        values = to_plain(cfg)
    except ConfigError as exc:
        return None, exc.errors
    errors, bad = _group_errors(values)
    target_errors = _target_errors(values)
    if target_errors:
        errors += target_errors
        bad.add("model")  # a refused _target_ is never imported
    typed = partial_config(values, bad)
    errors += _cross_errors(typed)
    return typed, errors


class Partial:
    """The typed sections of a config that has errors: a bad section (or "top") is None.

    Rules across keys and the launch plan read it and skip what they cannot judge,
    so that one bad key does not hide the errors of the others.
    """

    def __init__(self, values: Mapping[str, Any], bad: set[str]):
        for group in schema.OPTIONS:
            setattr(self, group, None if group in bad else schema.section_from_dict(group, values[group]))
        self.raw = values  # a bad section's plain values, for checks that need one good key of it
        self.top_ok = "top" not in bad
        for f in dataclasses.fields(schema.TopConfig):
            setattr(self, f.name, values.get(f.name) if self.top_ok else None)


def complete(cfg: Any, *sections: str) -> bool:
    """Whether `cfg` (a TrainConfig or a Partial) has these sections ("top" for the top level) valid."""
    if isinstance(cfg, schema.TrainConfig):
        return True
    return all(cfg.top_ok if s == "top" else getattr(cfg, s) is not None for s in sections)


def partial_config(values: Mapping[str, Any], bad: set[str]) -> Any:
    """A TrainConfig when nothing is bad, else a `Partial`."""
    if not bad:
        return schema.TrainConfig.from_dict(dict(values))
    return Partial(values, bad)


def check_config(cfg: DictConfig | Mapping[str, Any]) -> list[str]:
    """Every error in the config (see `checked`), or an empty list."""
    return checked(cfg)[1]
