"""Check command-line overrides before Hydra sees them, collecting every error.

Hydra stops at the first unknown group option or key. `preflight` instead
checks every group choice (`precision=fp8`), composes with the rest (value
overrides as `++key=value`, so an unknown key reaches the schema check and is
reported with the keys allowed there) and validates the result; for a sweep
(`-m`), every combination up to a limit is checked the same way.
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterable

from omegaconf import DictConfig

from clorch.config.compose import compose, config_groups, group_options, _is_path
from clorch.config.validate import ConfigError, check_config

MAX_COMBINATIONS = 64


def _choices(override) -> list[str]:
    if override.is_sweep_override():
        return list(override.sweep_string_iterator())
    return [override.get_value_element_as_str()]


def split_overrides(overrides: Iterable[str]) -> tuple[list[list[str]], list[str]]:
    """(for each override, its single-valued forms), group-choice errors.

    Hydra's own keys (hydra.*) are left out: they do not reach the job's config.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    groups = set(config_groups()) | {"recipe"}
    forms, errors = [], []
    for override in parsed:
        key = override.key_or_group
        if key.split(".")[0] == "hydra":
            continue
        prefix = {"ADD": "+", "FORCE_ADD": "++", "DEL": "~"}.get(override.type.name, "")
        values = _choices(override) if not override.is_delete() or override.value() else [None]
        if key in groups:
            allowed = group_options(key)
            good = [v for v in values if v in allowed or (key == "recipe" and _is_path(str(v)))]
            for bad in sorted(set(values) - set(good), key=str):
                errors.append(f"{key}={bad} is not allowed; choose one of: {', '.join(allowed)}")
            if good:
                forms.append([f"{prefix}{key}={v}" for v in good])
            continue
        if override.is_delete():
            forms.append([f"~{key}" if v is None else f"~{key}={v}" for v in values])
        else:
            forms.append([f"++{key}={v}" for v in values])
    return forms, errors


def preflight(overrides: Iterable[str], extra: Callable[[DictConfig], list[str]] | None = None,
              max_combinations: int = MAX_COMBINATIONS) -> list[str]:
    """Every error in the config these overrides compose to (all sweep combinations).

    Args:
        overrides: command-line overrides, as `clorch-train` receives them.
        extra: more checks on a composed config (the engine's machine checks);
            repeats of check_config's messages are dropped.
        max_combinations: check at most this many sweep combinations.
    """
    try:
        forms, errors = split_overrides(overrides)
    except Exception as exc:  # Hydra's grammar error names the bad override itself
        return [str(exc).strip()]
    for combo in itertools.islice(itertools.product(*forms), max_combinations):
        try:
            cfg = compose(list(combo))
        except (ValueError, Exception) as exc:  # a composition error from Hydra
            found = [str(exc).strip()]
        else:
            found = check_config(cfg) + (extra(cfg) if extra is not None else [])
        for error in found:
            if error not in errors:
                errors.append(error)
    return errors


def compose_checked(overrides: Iterable[str], extra: Callable[[DictConfig], list[str]] | None = None) -> DictConfig:
    """Compose one config (no sweeps) and raise every error in it at once.

    Raises:
        ConfigError: bad group choices, unknown keys, bad values, machine errors.
    """
    overrides = list(overrides)
    errors = preflight(overrides, extra)
    if errors:
        raise ConfigError(errors)
    forms, _ = split_overrides(overrides)
    return compose([f[0] for f in forms])
