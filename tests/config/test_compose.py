"""Every shipped recipe and every group option composes and validates (in-process Hydra)."""

from __future__ import annotations


import pytest

from clorch.config import TrainConfig, check_config, compose, config_groups, group_options, recipes_dir
from clorch.config import schema
from clorch.plan.plan import resolve

pytestmark = pytest.mark.timeout(120)

# Every recipe file shipped in the package: a new recipe is tested by being added.
RECIPES = tuple(sorted(p.name[: -len(".yaml")] for p in recipes_dir().iterdir() if p.name.endswith(".yaml")))
# Options that need a partner in another group to be valid on their own.
PARTNERS = {
    ("data", "arithmetic"): ["model=gpt"],
    ("data", "text"): ["model=gpt"],
    ("data", "tokens"): ["model=gpt"],
    ("model", "gpt"): ["data=arithmetic"],
    ("checkpoint", "periodic"): [],
    ("backend", "nccl"): [],
    ("model", "custom"): ["++model._target_=torch.nn.Linear"],  # custom is your own class
    ("data", "custom"): ["++data._target_=clorch.data.datasets.Blobs", "model=mlp", "loss=cross_entropy"],
    ("loss", "cross_entropy"): ["++data._target_=clorch.data.datasets.Blobs", "model=mlp"],
    ("loss", "mse"): ["++data._target_=clorch.data.datasets.Blobs", "model=mlp"],
    ("loss", "custom"): [
        "++loss._target_=torch.nn.functional.cross_entropy",
        "++data._target_=clorch.data.datasets.Blobs",
        "model=mlp",
    ],
    ("step", "custom"): [
        "++step._target_=clorch.data.datasets.classification_step",
        "++data._target_=clorch.data.datasets.Blobs",
        "model=mlp",
    ],
}


def test_shipped_recipes_are_all_there():
    assert {"cpu_smoke", "ddp_bf16", "ddp_fp16", "ddp_fp32", "gpt_bf16"} <= set(RECIPES)
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


def test_the_config_groups():
    assert set(config_groups()) == {
        "backend",
        "precision",
        "sampler",
        "ddp",
        "parallel",
        "checkpoint",
        "model",
        "data",
        "optim",
        "schedule",
        "launcher",
        "logger",
        "preflight",
        "loss",
        "step",
    }


@pytest.mark.parametrize(
    "group",
    [
        "backend",
        "precision",
        "sampler",
        "ddp",
        "parallel",
        "checkpoint",
        "model",
        "data",
        "optim",
        "schedule",
        "launcher",
        "logger",
        "preflight",
    ],
)
def test_every_group_option_composes_and_validates(group, tmp_path):
    for option in group_options(group):
        overrides = [f"{group}={option}", *PARTNERS.get((group, option), [])]
        if (group, option) == ("data", "text"):
            sample = tmp_path / "t.txt"
            sample.write_text("héllo wörld, " * 200)
            overrides.append(f"data.path={sample}")
        if (group, option) == ("data", "tokens"):
            (tmp_path / "train.bin").write_bytes(bytes(4096))  # 2048 uint16 zeros
            overrides.append(f"data.train_path={tmp_path / 'train.bin'}")
        if (group, option) == ("model", "mlp"):
            overrides.append("data=synthetic")
        cfg = compose(overrides)
        errors = check_config(cfg)
        if (group, option) == ("logger", "tensorboard"):
            errors = [e for e in errors if "tensorboard package" not in e]
        assert errors == [], f"{group}={option}: {errors}"


def test_the_composed_defaults_are_the_schemas_defaults():
    """The dataclasses are the only source of defaults: composing nothing gives TrainConfig()."""
    typed = TrainConfig.from_dict(dict(compose([])))
    assert typed == TrainConfig()
    assert check_config(compose([])) == []


def test_model_and_scaler_defaults_come_from_the_library():
    from clorch.amp import GradScaler
    from clorch.models import GPTConfig
    from clorch.models.mlp import MLP

    gpt, library = schema.GPTConfig(), GPTConfig()
    for name in ("n_layer", "n_head", "d_model", "mlp_ratio", "dropout", "tie_weights", "bias"):
        assert getattr(gpt, name) == getattr(library, name), name
    assert schema.MLPConfig().hidden_features == schema.default_of(MLP, "hidden_features")
    scaler = GradScaler("cpu")
    assert schema.ScalerConfig().initial_scale == scaler.get_scale()
    assert schema.ScalerConfig().growth_interval == scaler.get_growth_interval()


def test_options_carry_only_their_own_keys():
    sgd, adamw = compose(["optim=sgd"]).optim, compose([]).optim
    assert "betas" not in sgd and "momentum" not in adamw
    assert "min_lr_ratio" not in compose([]).schedule
    assert "scaler" not in compose(["precision=bf16"]).precision


def test_the_configs_are_package_data():
    """config.yaml and the recipes are read through importlib.resources, and the wheel ships them."""
    import tomllib
    from importlib import resources
    from pathlib import Path

    assert (resources.files("clorch.conf") / "config.yaml").is_file()
    assert (resources.files("clorch.recipes") / "ddp_bf16.yaml").is_file()
    root = Path(__file__).resolve().parents[2]
    package_data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert package_data == {
        "clorch.conf": ["*.yaml", "*/*.yaml", "hydra/sweeper/*.yaml"],  # clorch's sweepers (docs/sweeps.md)
        "clorch.recipes": ["*.yaml"],
    }
    assert (resources.files("clorch.conf") / "hydra" / "sweeper" / "clorch_optuna.yaml").is_file()


def test_no_config_module_is_shadowed_by_an_exported_name():
    import importlib
    import pkgutil

    import clorch.config as package

    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"clorch.config.{info.name}")
        assert getattr(package, info.name) is module, f"clorch.config.{info.name} is shadowed"
