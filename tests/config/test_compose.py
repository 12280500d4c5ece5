"""Every shipped recipe and every group option composes and validates (in-process Hydra)."""

from __future__ import annotations

import dataclasses

import pytest

from clorch.config import check_config, compose, config_groups, group_options, recipes_dir
from clorch.config import schema
from clorch.engine.resolve import resolve

pytestmark = pytest.mark.timeout(120)

RECIPES = ("cpu_smoke", "ddp_bf16", "ddp_fp16", "ddp_fp32", "gpt_bf16")
# Options that need a partner in another group to be valid on their own.
PARTNERS = {("data", "arithmetic"): ["model=gpt"], ("data", "text"): ["model=gpt"],
            ("model", "gpt"): ["data=arithmetic"], ("checkpoint", "periodic"): [],
            ("backend", "nccl"): []}


def test_shipped_recipes_are_all_there():
    assert set(RECIPES) <= set(group_options("recipe"))
    for name in RECIPES:
        text = (recipes_dir() / f"{name}.yaml").read_text()
        assert text.startswith("# @package _global_"), name
        assert f"clorch-train +recipe={name}" in text, f"{name}: the header gives the command"


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_composes_validates_and_resolves(recipe):
    cfg = compose([f"+recipe={recipe}"])
    assert check_config(cfg) == []
    resolved = resolve(cfg)
    assert resolved.total_steps >= 1
    assert resolved.world_size >= 1


def test_recipes_set_what_their_names_say():
    assert compose(["+recipe=ddp_bf16"]).precision.name == "bf16"
    assert compose(["+recipe=ddp_fp16"]).precision.scaler.enabled is True
    assert compose(["+recipe=ddp_fp32"]).precision.name == "fp32"
    gpt = compose(["+recipe=gpt_bf16"])
    assert (gpt.model.name, gpt.data.name, gpt.schedule.name) == ("gpt", "arithmetic", "cosine")
    smoke = compose(["+recipe=cpu_smoke"])
    assert (smoke.backend, smoke.launcher.nproc_per_node) == ("gloo", 2)


def test_groups_match_the_issue():
    assert set(config_groups()) == {"backend", "precision", "sampler", "ddp", "checkpoint", "model",
                                    "data", "optim", "schedule", "launcher", "logger"}


@pytest.mark.parametrize("group", ["backend", "precision", "sampler", "ddp", "checkpoint", "model",
                                   "data", "optim", "schedule", "launcher", "logger"])
def test_every_group_option_composes_and_validates(group, tmp_path):
    for option in group_options(group):
        overrides = [f"{group}={option}", *PARTNERS.get((group, option), [])]
        if (group, option) == ("data", "text"):
            sample = tmp_path / "t.txt"
            sample.write_text("héllo wörld, " * 200)
            overrides.append(f"data.path={sample}")
        if (group, option) == ("model", "mlp"):
            overrides.append("data=synthetic")
        cfg = compose(overrides)
        errors = check_config(cfg)
        if (group, option) == ("logger", "tensorboard"):
            errors = [e for e in errors if "tensorboard package" not in e]
        assert errors == [], f"{group}={option}: {errors}"


def test_yaml_defaults_match_the_schemas():
    """The dataclass defaults document the YAML values: they must agree."""
    cfg = compose([])
    for group, cls in schema.GROUPS.items():
        if isinstance(cls, dict):
            cls = cls[cfg[group].name]
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(f.type) or f.name == "scaler":
                continue
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            assert cfg[group][f.name] == default, f"{group}.{f.name}"
    top = {f.name: f.default for f in dataclasses.fields(schema.TopConfig)}
    for key, default in top.items():
        assert cfg[key] == default, key


def test_every_config_folder_ships_in_the_wheel():
    """pyproject.toml's data-files must list each config group folder (a wheel has no checkout)."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    shipped = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    folders = {"conf", "recipes", *(f"conf/{g}" for g in config_groups())}
    assert {dest.removeprefix("share/clorch/") for dest in shipped} == folders
    for dest, patterns in shipped.items():
        assert patterns == [f"{dest.removeprefix('share/clorch/')}/*.yaml"], dest
