"""Check command-line overrides before Hydra sees them, collecting every error.

Hydra stops at the first unknown group option or key. clorch instead checks
every group choice (`precision=fp8`) and the chosen recipe's own defaults
entries up front, and value overrides reach Hydra as `++key=value`
(`clorch.config.composer.hydra_overrides`), so an unknown key reaches the schema
check and is reported (with the closest known key) together with every other error.
`check_overrides` composes each combination of a sweep (`-m`), up to a limit, and
checks it the same way.
"""

from __future__ import annotations

import difflib
import itertools
from typing import Callable, Iterable

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from clorch.config.checks import check_config
from clorch.config.composer import (
    _is_path,
    compose,
    config_groups,
    group_options,
    name_recipe_in_errors,
    recipe_errors,
    registered_name,
)
from clorch.config.fields import did_you_mean
from clorch.config.schema import CUSTOM, TARGET_GROUPS

MAX_COMBINATIONS = 64


def _choices(override) -> list[str]:
    if override.is_sweep_override():
        return list(override.sweep_string_iterator())
    return [override.get_value_element_as_str()]


def _close(value: str, allowed: list[str]) -> str:
    close = difflib.get_close_matches(value, allowed, n=1, cutoff=0.6)
    return f"did you mean {close[0]}? " if close else ""


def _recipe_name(value: str) -> str:
    return registered_name(value)


def split_overrides(overrides: Iterable[str]) -> tuple[list[list[str]], list[str]]:
    """(for each override, its single-valued forms), group-choice errors.

    Hydra's own keys (hydra.*) are left out: they do not reach the job's config.
    """
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    groups = set(config_groups()) | {"recipe"}
    forms, errors = [], _recipe_slips(parsed)
    recipes = 0
    for override in parsed:
        key = override.key_or_group
        if key.replace("/", ".").split(".")[0] == "hydra":  # hydra.run.dir, hydra/launcher=...
            continue
        prefix = {"ADD": "+", "FORCE_ADD": "++", "DEL": "~"}.get(override.type.name, "")
        if key in groups and key != "recipe" and prefix:  # `+optim=sgd`: composed as meant, reported
            errors += _group_slips(override, prefix)
            prefix = "~" if override.is_delete() else ""
        values = _choices(override) if not override.is_delete() or override.value() else [None]
        if key in groups:
            allowed = group_options(key)
            good = [v for v in values if v in allowed or (key == "recipe" and _is_path(str(v)))]
            for bad in sorted(set(values) - set(good), key=str):
                hint = _close(str(bad), allowed)
                errors.append(f"{key}={bad} is not allowed; {hint}choose one of: {_listed(key, allowed)}")
            if key == "recipe":
                for value in good:
                    errors += [e for e in recipe_errors(_recipe_name(str(value))) if e not in errors]
            if key == "recipe":  # a slip is reported above; compose as meant, to find the other errors
                prefix, recipes = "+", recipes + 1
            if good and not (key == "recipe" and recipes > 1):
                forms.append([f"{prefix}{key}={v}" for v in good])
            continue
        if override.is_delete():
            forms.append([f"~{key}" if v is None else f"~{key}={v}" for v in values])
        else:
            forms.append([f"++{key}={v}" for v in values])
    slips, kept = _add_and_delete_slips(parsed, forms)
    return kept, errors + slips


def _group_slips(override, prefix: str) -> list[str]:
    """Hydra's `+GROUP=OPTION`, `++GROUP=OPTION` and `~GROUP` on clorch's groups, which are all in
    the defaults list already: the fix is `GROUP=OPTION`."""
    key, line = override.key_or_group, override.input_line
    if prefix == "~":
        return []  # a group removed is reported by the checks: `optim is missing: choose one of ...`
    value = (
        override.get_value_element_as_str()
        if not override.is_sweep_override()
        else ",".join(override.sweep_string_iterator())
    )
    what = "'+' adds a group that is not chosen yet" if prefix == "+" else "'++' adds or sets a key, not a group"
    return [
        f"{line}: every config group has an option already ({key} has its default), and {what}; "
        f"choose another option with {key}={value}"
    ]


def _add_and_delete_slips(parsed: list, forms: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """(errors for `+KEY=V` on a key the config has and `~KEY` on one it lacks, the forms without
    those deletions).

    Hydra stops at either with its own message (`Could not append to config`,
    `Could not delete from config`); these say what to write instead. Judged on the
    config the other overrides compose to (the first value of each sweep).
    """
    slipped = [
        o
        for o in parsed
        if o.key_or_group.split(".")[0] != "hydra"
        and "/" not in o.key_or_group
        and o.key_or_group not in set(config_groups()) | {"recipe"}
        and (o.type.name == "ADD" or o.is_delete())
    ]
    if not slipped:
        return [], forms
    judged = {f"{'~' if o.is_delete() else '++'}{o.key_or_group}" for o in slipped}
    others = [f for f in forms if f[0].partition("=")[0] not in judged]
    try:
        cfg = compose([f[0] for f in others])
    except Exception:  # reported when the whole config is composed
        return [], forms
    errors, absent = [], set()
    for override in slipped:
        key, line = override.key_or_group, override.input_line
        found = OmegaConf.select(cfg, key, default=_ABSENT, throw_on_missing=False)
        if override.type.name == "ADD" and found is not _ABSENT:
            value = line.partition("=")[2]
            errors.append(
                f"{line}: {key} is in the config already, and '+' adds only a key that is not; "
                f"set it with {key}={value}"
            )
        elif override.is_delete() and found is _ABSENT:
            parent, _, leaf = key.rpartition(".")
            section = OmegaConf.select(cfg, parent, default=None) if parent else cfg
            known = [str(k) for k in section] if OmegaConf.is_dict(section) else []
            hint = did_you_mean(leaf, known)
            errors.append(
                f"{line}: the config has no key {key} to delete; {hint}"
                f"{'keys here: ' + ', '.join(known) if known else 'leave it out'}"
            )
            absent.add(f"~{key}")
        elif override.is_delete() and override.value() is not None and _shown(found) != _shown(override.value()):
            errors.append(
                f"{line}: {key} is {_shown(found)}, not {_shown(override.value())}; write ~{key} to "
                "delete it whatever its value"
            )
            absent.add(f"~{key}")
    return errors, [f for f in forms if f[0].partition("=")[0] not in absent]


_ABSENT = object()


def _shown(value) -> str:
    return str(OmegaConf.to_container(value) if OmegaConf.is_config(value) else value)


def _recipe_slips(parsed: list) -> list[str]:
    """Hydra's two common recipe mistakes, as config errors: `recipe=NAME` without `+` (recipe is
    not in the defaults list, so it must be added) and more than one recipe."""
    recipes = [o for o in parsed if o.key_or_group == "recipe" and not o.is_delete()]
    errors = [
        f"{o.input_line} needs a '+': a recipe is added to the defaults, so write +{o.input_line}"
        for o in recipes
        if o.type.name == "CHANGE"
    ]
    if len(recipes) > 1:
        named = ", ".join(o.input_line for o in recipes)
        errors.append(
            f"one recipe per run, got {len(recipes)}: {named}; put what you need from one into "
            "the other (a recipe file may list another recipe's groups), or sweep over recipes "
            "with -m +recipe=a,b"
        )
    return errors


def grammar_errors(overrides: Iterable[str]) -> list[str]:
    """One error for each override Hydra's override grammar refuses, naming the override."""
    errors = []
    for override in overrides:
        try:
            OverridesParser.create().parse_overrides([override])
        except Exception as exc:
            reason = str(exc).strip().splitlines()[0]
            errors.append(
                f"{override!r} is not a valid override ({reason}); a value with brackets, "
                "commas or spaces needs quotes in the shell, e.g. 'optim.betas=[0.9,0.95]'"
            )
    return errors


def check_overrides(
    overrides: Iterable[str],
    extra: Callable[[DictConfig], list[str]] | None = None,
    max_combinations: int = MAX_COMBINATIONS,
) -> list[str]:
    """Every error in the config these overrides compose to (all sweep combinations).

    Args:
        overrides: command-line overrides, as `clorch-train` receives them.
        extra: more checks on a composed config (the launch plan's); without it,
            only the config's own checks run.
        max_combinations: check at most this many sweep combinations.
    """
    overrides = list(overrides)
    try:
        forms, errors = split_overrides(overrides)
    except Exception as exc:  # Hydra's grammar error: name each override it refuses
        return grammar_errors(overrides) or [str(exc).strip()]
    for combo in itertools.islice(itertools.product(*forms), max_combinations):
        try:
            cfg = compose(list(combo))
        except Exception as exc:  # a composition error from Hydra
            found = [str(exc).strip()]
        else:
            found = extra(cfg) if extra is not None else check_config(cfg)
            recipes = [_recipe_name(c.partition("=")[2]) for c in combo if c.partition("=")[0].lstrip("+") == "recipe"]
            found = name_recipe_in_errors(found, recipes, overrides)
        for error in found:
            if error not in errors:
                errors.append(error)
    return errors


def compose_once(overrides: Iterable[str]) -> tuple[DictConfig | None, list[str]]:
    """Compose one config (no sweeps): (the config or None, the group-choice and recipe errors).

    Bad group choices are left out so that the rest still composes and its own
    errors can be reported with them.
    """
    try:
        forms, errors = split_overrides(overrides)
    except Exception as exc:  # Hydra's grammar error names the bad override itself
        return None, [str(exc).strip()]
    try:
        return compose([f[0] for f in forms]), errors
    except Exception as exc:  # a composition error from Hydra
        return None, [*errors, str(exc).strip()]


def _listed(group: str, allowed: list[str]) -> str:
    """A group's options for a message: `custom` is chosen by naming `GROUP._target_`, so it is
    said that way."""
    if group not in TARGET_GROUPS:
        return ", ".join(allowed)
    return f"{', '.join(o for o in allowed if o != CUSTOM)}, or your own class with {group}._target_=my_project.Class"
