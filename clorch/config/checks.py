"""Validate a composed config against the schemas, collecting every error at once.

Nothing launches on a bad config: `check_config` returns a list of messages,
each naming the key, the value received and what is allowed, and
`ConfigError` carries them all. Each section's keys, types and value rules
are checked by `clorch.config.fields`; here are the group choices, the rules
that tie keys together, and the `_target_` checks.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from clorch.config import registry, schema
from clorch.config import user_code
from clorch.config.fields import check_section, did_you_mean
from clorch.config.options.checkpoint import reused_dir_errors
from clorch.config.targets import check_target, find_targets, trusted_module_errors
from clorch.config.user_code import TARGET_KEYS, target_section_errors

__all__ = ["ConfigError", "check_config", "checked", "checked_partial", "complete", "reused_dir_errors", "to_plain"]


EXIT_STATUS = 2
"""The exit status of a command that stopped on config errors (nothing was launched)."""


def print_config_errors(errors: list[str]) -> None:
    """Print every config error to stderr, as `clorch-train` reports them."""
    print(f"clorch-train: {len(errors)} config error(s); nothing was launched:", file=sys.stderr)
    for error in errors:
        print(f"  - {error}", file=sys.stderr)


class ConfigError(ValueError):
    """One or more config errors; `.errors` holds every message."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        lines = "\n".join(f"  - {e}" for e in self.errors)
        super().__init__(f"{len(self.errors)} config error(s):\n{lines}")


def _option_of(group: str, values: Mapping[str, Any]) -> tuple[str, type | None, list[str]]:
    """(the option a group section is, as messages name it: `precision=fp16`; its schema, or None
    with an error)."""
    options = registry.options(group)
    selector = registry.groups()[group].selector
    if selector is None:  # one option, no key naming it
        name = next(iter(options))
        return f"{group}={name}", registry.schemas(group)[name], []
    option = values.get(selector)
    if option in options:
        return f"{group}={option}", registry.schemas(group)[option], []
    return "", None, [f"{group}={option!r} is not allowed; choose one of: {', '.join(sorted(options))}"]


def _group_errors(cfg: Mapping[str, Any]) -> tuple[list[str], set[str]]:
    """(every error in the groups and top-level keys, the groups and "top" that have errors)."""
    errors, bad = [], set()
    for group in registry.groups():
        before = len(errors)
        _check_group(cfg, group, errors)
        if len(errors) > before:
            bad.add(group)
    top = {k: v for k, v in cfg.items() if k not in registry.groups()}
    unknown, known_errors = _top_errors(top)
    if known_errors:  # an unknown top-level key leaves the known ones usable
        bad.add("top")
    return errors + unknown + known_errors, bad


def _check_group(cfg: Mapping[str, Any], group: str, errors: list[str]) -> None:
    """Append the errors of one group section to `errors`."""
    values = cfg.get(group)
    if not isinstance(values, Mapping):
        errors.append(
            f"{group} must be a config group (mapping), got {values!r}"
            if group in cfg
            else f"{group} is missing: choose one of {', '.join(sorted(registry.options(group)))} ({group}=OPTION)"
        )
        return
    if group in schema.TARGET_SCHEMAS and "_target_" in values:
        errors += target_section_errors(group, values)
        return
    if group in schema.TARGET_GROUPS and values.get("name") == schema.CUSTOM:
        errors.append(
            f"{group}={schema.CUSTOM} needs {group}._target_ (your class, e.g. "
            f"{group}._target_=my_project.models.Net) or a built-in option: "
            f"{', '.join(sorted(registry.options(group)))}"
        )
        return
    owner, option, problems = _option_of(group, values)
    if option is None:
        errors += problems
        return
    errors += check_section(f"{group}.", values, option, owner=owner, siblings=registry.schemas(group))


def _top_errors(top: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(errors for unknown top-level keys, errors in TopConfig's keys)."""
    known = [f.name for f in dataclasses.fields(schema.TopConfig)]
    groups = sorted(registry.groups())
    errors = []
    for key in top:
        if key not in known:
            allowed = ", ".join([*known, *(f"{g} (group)" for g in groups)])
            nested = _group_keys_named(key)
            hint = f"did you mean {' or '.join(nested)}? " if nested else did_you_mean(key, [*known, *groups])
            errors.append(f"{key} is not a known key; {hint}allowed: {allowed}")
    return errors, check_section("", {k: v for k, v in top.items() if k in known}, schema.TopConfig)


def _group_keys_named(key: str) -> list[str]:
    """`group.key` for every group with an option that has `key` (sample_count -> data.sample_count)."""
    return [
        f"{group}.{key}"
        for group in sorted(registry.groups())
        if any(key in {f.name for f in dataclasses.fields(cls)} for cls in registry.schemas(group).values())
    ]


def _target_errors(cfg: Mapping[str, Any]) -> tuple[list[str], set[str]]:
    """(the allow-list's errors for the `_target_` keys clorch honours, and an error for a
    `_target_` anywhere else; the groups whose target was refused, which are never imported)."""
    errors, refused = trusted_module_errors(), set()
    for where, target in find_targets(cfg):
        group = where.split(".")[0]
        nested = (
            group in schema.TARGET_GROUPS and isinstance(cfg.get(group), Mapping) and "_target_" in cfg[group]
        )  # an object built for an argument of your own code
        if where in TARGET_KEYS or nested:
            found = check_target(where, target)
            errors += found
            if found:
                refused.add(group)
        else:
            errors.append(
                f"{where} is not supported: only {', '.join(TARGET_KEYS)} are honoured, and "
                f"objects nested in their sections' arguments (got {where}={target!r}; remove it)"
            )
    return errors, refused


def _cross_errors(cfg: Any) -> list[str]:
    """Rules that involve more than one key, run once every key is valid on its own: each
    option's own (`rules`, clorch.config.registry), the top level's and your code's."""
    errors = []
    for group in registry.groups():
        section = getattr(cfg, group)
        if section is not None and hasattr(section, "rules"):
            errors += section.rules(cfg)
    if complete(cfg, "top"):
        errors += _unused_top_keys(cfg)
        errors += _top_rules(cfg)
    errors += user_code.cross_errors(cfg)
    return errors


def _top_rules(cfg: Any) -> list[str]:
    return _cuda_graph_rules(cfg) + _exact_rules(cfg)


def _exact_rules(cfg: Any) -> list[str]:
    """What exact=true cannot make exact yet, refused by name."""
    if not cfg.exact:
        return []
    errors = []
    if complete(cfg, "parallel") and cfg.parallel.name not in ("ddp", "fsdp"):
        errors.append(
            f"exact=true runs with parallel=ddp or parallel=fsdp, got parallel={cfg.parallel.name}: its "
            "gradients are not summed in a fixed order; use parallel=ddp, or exact=false"
        )
    if complete(cfg, "parallel", "precision") and cfg.parallel.name == "fsdp":
        errors += _exact_fsdp_rules(cfg.parallel, cfg.precision)
    if complete(cfg, "ddp") and cfg.ddp.step_in_backward:
        errors.append(
            "exact=true sums the step's gradients after the last backward, so backward cannot step "
            "the optimizer: drop ddp.step_in_backward=true, or exact=false"
        )
    elif complete(cfg, "ddp", "parallel") and cfg.parallel.name == "ddp":
        errors += _unused_ddp_keys(cfg.ddp)
    return errors


def _unused_ddp_keys(ddp: Any) -> list[str]:
    """The `ddp` keys set away from their defaults, which exact=true's tree makes do nothing."""
    defaults = type(ddp)()
    return [
        f"ddp.{f.name}={getattr(ddp, f.name)!r} does nothing with exact=true (the gradients are summed in "
        "a fixed tree, not in DDP's buckets): drop it, or exact=false"
        for f in dataclasses.fields(ddp)
        if f.name != "name" and getattr(ddp, f.name) != getattr(defaults, f.name)
    ]


def _exact_fsdp_rules(parallel: Any, precision: Any) -> list[str]:
    """The parallel=fsdp settings whose numerics are not parallel=ddp's under exact=true."""
    errors = []
    runs_as = precision.runs_as or precision.name
    if runs_as != "fp32" and parallel.param_dtype == "auto":
        errors.append(
            f"exact=true with parallel=fsdp and precision={precision.name} needs parallel.param_dtype=fp32, "
            "got parallel.param_dtype=auto: auto gathers the parameters in the precision's dtype, so "
            "layers autocast leaves in fp32 (LayerNorm, the loss) would compute with rounded weights, "
            "unlike parallel=ddp; add parallel.param_dtype=fp32, or exact=false"
        )
    if getattr(precision, "fsdp_float8_all_gather", False):
        errors.append(
            "exact=true with parallel=fsdp cannot keep precision.fsdp_float8_all_gather=true (float8 "
            "weights gathered from their shards are not shown to be parallel=ddp's): add "
            "precision.fsdp_float8_all_gather=false, or exact=false"
        )
    if parallel.cpu_offload:
        errors.append(
            "exact=true with parallel=fsdp cannot keep parallel.cpu_offload=true (the optimizer would "
            "step in host memory, with other kernels than parallel=ddp's): drop parallel.cpu_offload, "
            "or exact=false"
        )
    return errors


def _cuda_graph_rules(cfg: Any) -> list[str]:
    if cfg.compile and cfg.compile_mode in schema.CUDA_GRAPH_MODES and cfg.accumulation > 1:
        return [
            f"compile_mode={cfg.compile_mode} replays CUDA graphs, which reuse their output memory "
            f"at every forward, so gradients cannot accumulate over micro-batches (got "
            f"accumulation={cfg.accumulation}): use accumulation=1, or compile_mode=default or "
            "max-autotune-no-cudagraphs"
        ]
    return []


def _unused_top_keys(cfg: schema.TrainConfig) -> list[str]:
    """Top-level keys that another key switches off."""
    if not cfg.compile and cfg.compile_mode != schema.TopConfig.compile_mode:
        return [
            f"compile_mode={cfg.compile_mode} does nothing with compile=false: add compile=true, or drop compile_mode"
        ]
    return []


def to_plain(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    """Plain containers with interpolations resolved: a new copy, whatever `cfg` is.

    Raises:
        ConfigError: an interpolation does not resolve.
    """
    if not isinstance(cfg, DictConfig):
        return copy.deepcopy(dict(cfg))
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception as exc:  # an interpolation that does not resolve
        raise ConfigError([unresolved_message(cfg, exc)]) from None


def unresolved_message(cfg: DictConfig, exc: Exception) -> str:
    """'KEY=VALUE does not resolve: REASON', from OmegaConf's interpolation error."""
    key = getattr(exc, "full_key", None)
    reason = (getattr(exc, "msg", None) or str(exc)).strip().splitlines()[0]
    if not key:
        return f"the config does not resolve: {reason}"
    parent, _, leaf = key.rpartition(".")
    try:  # the value as written, before resolving
        raw = (OmegaConf.select(cfg, parent) if parent else cfg)._get_node(leaf)._value()
    except Exception:  # a key OmegaConf cannot look up unresolved
        raw = None
    shown = f"{key}={raw}" if isinstance(raw, str) else key
    return f"{shown} does not resolve: {reason} (interpolations: ${{oc.env:NAME,default}}, ${{other.key}})"


def checked(cfg: DictConfig | Mapping[str, Any]) -> tuple[schema.TrainConfig | None, list[str]]:
    """(the typed config, or None, and every error in the config).

    Checks unknown and missing keys, types, ranges and choices of every group
    against `clorch.config.schema`, the `_target_` allow-list, then the rules
    across keys (model/data fit, the checkpoint policy, paths that must exist).
    """
    typed, errors = checked_partial(cfg)
    return (typed, []) if not errors else (None, errors)


def checked_partial(
    cfg: DictConfig | Mapping[str, Any], base: str | os.PathLike | None = None
) -> tuple[Any, list[str]]:
    """(a TrainConfig, or a `Partial` of its good sections, or None; every error).

    Args:
        base: make the config's relative paths absolute against this directory first
            (where the user ran clorch-train); None leaves them as written.

    None only when the config does not resolve at all; later checks (the launch
    plan) judge what the good sections allow.
    """
    try:
        values = to_plain(cfg)
    except ConfigError as exc:
        return None, exc.errors
    if base is not None:
        make_paths_absolute(values, base)
    errors, bad = _group_errors(values)
    target_errors, refused = _target_errors(values)
    errors += target_errors
    bad |= refused  # a refused _target_ is never imported
    sections = {
        group: schema.section_from_dict(group, values[group]) for group in registry.groups() if group not in bad
    }
    typed = schema.TrainConfig(**schema.top_values(values), **sections) if not bad else Partial(values, sections, bad)
    errors += _cross_errors(typed)
    return typed, errors


_NOT_PATHS = {"none", "latest"}  # checkpoint.resume's words


def make_paths_absolute(values: dict[str, Any], base: str | os.PathLike) -> None:
    """Make the relative paths of a plain config (every key marked `rule(path=True)`) absolute
    against `base`, in place."""
    for section, _, key in (k.partition(".") for k in registry.path_keys()):
        node = values.get(section)
        value = node.get(key) if isinstance(node, dict) else None
        if isinstance(value, str) and value and value not in _NOT_PATHS:
            path = Path(value).expanduser()
            node[key] = str(path if path.is_absolute() else Path(base) / path)


class Partial:
    """The typed sections of a config that has errors: a bad section (or "top") is None.

    Rules across keys and the launch plan read it and skip what they cannot judge,
    so that one bad key does not hide the errors of the others.
    """

    def __init__(self, values: Mapping[str, Any], sections: Mapping[str, Any], bad: set[str]):
        for group in registry.groups():
            setattr(self, group, sections.get(group))
        self.raw = values  # a bad section's plain values, for checks that need one good key of it
        self.top_ok = "top" not in bad
        for f in dataclasses.fields(schema.TopConfig):
            setattr(self, f.name, values.get(f.name) if self.top_ok else None)


def complete(cfg: Any, *sections: str) -> bool:
    """Whether `cfg` (a TrainConfig or a Partial) has these sections ("top" for the top level) valid."""
    if isinstance(cfg, schema.TrainConfig):
        return True
    return all(cfg.top_ok if s == "top" else getattr(cfg, s) is not None for s in sections)


def check_config(cfg: DictConfig | Mapping[str, Any]) -> list[str]:
    """Every error in the config (see `checked`), or an empty list."""
    return checked(cfg)[1]
