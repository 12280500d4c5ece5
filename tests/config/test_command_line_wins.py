"""The command line beats a recipe, and a recipe beats the defaults, for every group and shorthand.

A recipe sets something in each group a recipe can set (an option through its
defaults list, a value in the group's section, a `_target_` of your own code);
the command line then chooses another option of that group. The composed
section must be that option's alone: the recipe's keys, its `_target_`
included, go with the option they belonged to.
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from hydra import compose as hydra_compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from clorch.config import compose, config_groups, group_options
from clorch.config.composer import CONFIG_MODULE, rewrite_recipe_overrides
from clorch.config.overrides import check_overrides
from clorch.config.registry import groups as registered_groups
from clorch.config.schema import CUSTOM, SHORTHAND, TARGET_GROUPS

OPTIONS = registered_groups()  # every config group

pytestmark = pytest.mark.timeout(120)

# For each group: (what the recipe says, the option the command line chooses instead).
RECIPE_SETS = {
    "backend": ("backend: nccl\n", "gloo"),
    "precision": ("defaults:\n  - override /precision: fp16\nprecision:\n  scaler:\n    init_scale: 8.0\n", "fp32"),
    "sampler": ("sampler:\n  shuffle: false\n", "distributed"),
    "ddp": ("ddp:\n  bucket_cap_mb: 1\n", "default"),
    "checkpoint": ("defaults:\n  - override /checkpoint: periodic\ncheckpoint:\n  every_n_steps: 7\n", "final"),
    "model": ("model:\n  _target_: torch.nn.Linear\n  in_features: 8\n  out_features: 4\n", "mlp"),
    "data": ("data:\n  _target_: clorch.data.datasets.Blobs\n  classes: 3\n", "synthetic"),
    "optim": ("optim:\n  lr: 0.5\n", "sgd"),
    "schedule": ("defaults:\n  - override /schedule: cosine\nschedule:\n  warmup_steps: 3\n", "constant"),
    "launcher": ("launcher:\n  nproc_per_node: 3\n", "torchrun"),
    "logger": ("defaults:\n  - override /logger: tensorboard\nlogger:\n  experiment: mine\n", "jsonl"),
    "preflight": ("preflight: only\n", "default"),
    "loss": ("loss:\n  _target_: torch.nn.functional.l1_loss\n  reduction: sum\n", "mse"),
    "step": ("step:\n  _target_: clorch.data.datasets.classification_step\n", "auto"),
    "parallel": ("defaults:\n  - override /parallel: fsdp\nparallel:\n  min_params: 7\n", "ddp"),
}


def _recipe(tmp_path, name: str, text: str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text("# @package _global_\n" + text)
    return str(path)


def _section(cfg, group: str):
    value = cfg[group]
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def test_every_group_a_recipe_can_set_is_listed():
    assert set(RECIPE_SETS) == set(config_groups())


@pytest.mark.parametrize("group", sorted(RECIPE_SETS))
def test_an_option_chosen_on_the_command_line_drops_the_recipes_keys_for_it(group, tmp_path):
    text, other = RECIPE_SETS[group]
    recipe = _recipe(tmp_path, group, text)
    alone = _section(compose([f"{group}={other}"]), group)
    with_recipe = compose([f"+recipe={recipe}"])
    # The recipe beats the defaults...
    assert _section(with_recipe, group) != _section(compose([]), group), "the recipe sets nothing here"
    # ... and the command line beats the recipe, before or after it.
    for args in ([f"+recipe={recipe}", f"{group}={other}"], [f"{group}={other}", f"+recipe={recipe}"]):
        assert _section(compose(args), group) == alone, args
    # The recipe's other groups are untouched.
    rest = [g for g in RECIPE_SETS if g != group]
    mixed = compose([f"+recipe={recipe}", f"{group}={other}"])
    assert {g: _section(mixed, g) for g in rest} == {g: _section(with_recipe, g) for g in rest}


@pytest.mark.parametrize("group", ["precision", "checkpoint", "optim", "schedule", "logger", "loss"])
def test_a_sweep_over_options_drops_the_recipes_keys_for_every_choice(group, tmp_path):
    # A sweep's jobs are composed by Hydra from the command line clorch rewrote once: the
    # recipe registered then must already be without the group the sweep chooses.
    text, other = RECIPE_SETS[group]
    recipe = _recipe(tmp_path, group, text)
    options = [o for o in group_options(group) if o != CUSTOM][:2]
    args = rewrite_recipe_overrides([f"+recipe={recipe}", f"{group}={','.join(options)}"])
    for option in options:
        GlobalHydra.instance().clear()
        with initialize_config_module(config_module=CONFIG_MODULE, version_base=None):
            cfg = hydra_compose(config_name="config", overrides=[*args[:-1], f"{group}={option}"])
        assert _section(cfg, group) == _section(compose([f"{group}={option}"]), group), option


def test_a_value_on_the_command_line_beats_the_recipes_and_the_recipes_the_default(tmp_path):
    recipe = _recipe(tmp_path, "values", "optim:\n  lr: 0.5\nepochs: 7\nmodel:\n  hidden_features: 16\n")
    assert compose([]).optim.lr != 0.5
    cfg = compose([f"+recipe={recipe}"])
    assert (cfg.optim.lr, cfg.epochs, cfg.model.hidden_features) == (0.5, 7, 16)
    cfg = compose([f"+recipe={recipe}", "optim.lr=0.25", "epochs=2"])
    assert (cfg.optim.lr, cfg.epochs, cfg.model.hidden_features) == (0.25, 2, 16)


def test_the_shorthands_on_the_command_line_beat_the_recipes():
    assert set(SHORTHAND) == {"loss", "preflight"}  # a new shorthand is tested by being added here


@pytest.mark.parametrize(
    "recipe_says, typed, expected",
    [
        ("loss: cross_entropy\n", "loss=mse", {"name": "mse"}),
        ("loss:\n  _target_: my_project.losses.focal\n  gamma: 2.0\n", "loss=cross_entropy", {"name": "cross_entropy"}),
        ("defaults:\n  - override /loss: mse\n", "loss=cross_entropy", {"name": "cross_entropy"}),
        ("loss: mse\n", "loss=auto", {"name": "auto"}),
    ],
)
def test_the_loss_the_command_line_names_is_the_loss(recipe_says, typed, expected, tmp_path):
    recipe = _recipe(tmp_path, "loss", recipe_says)
    assert _section(compose([f"+recipe={recipe}", typed]), "loss") == expected


@pytest.mark.parametrize(
    "recipe_says, typed, mode",
    [
        ("preflight: only\n", "preflight=false", False),
        ("preflight: only\n", "preflight=default", "auto"),
        ("preflight:\n  mode: true\n  slow_ratio: 0.5\n", "preflight=only", "only"),
        ("preflight: false\n", "preflight.mode=true", True),
    ],
)
def test_the_preflight_the_command_line_names_is_the_preflight(recipe_says, typed, mode, tmp_path):
    recipe = _recipe(tmp_path, "pre", recipe_says)
    section = _section(compose([f"+recipe={recipe}", typed]), "preflight")
    assert section["mode"] == mode
    if typed == "preflight=default":  # the option chosen: none of the recipe's keys
        assert section == _section(compose([]), "preflight")
    if typed == "preflight=only":  # a value: the recipe's other keys stay
        assert section["slow_ratio"] == 0.5


def test_a_target_on_the_command_line_replaces_the_recipes_target_and_its_arguments(tmp_path):
    recipe = _recipe(
        tmp_path,
        "focal",
        "loss:\n  _target_: torch.nn.functional.l1_loss\n  reduction: sum\n"
        "model:\n  _target_: torch.nn.Linear\n  in_features: 8\n",
    )
    cfg = compose(
        [
            f"+recipe={recipe}",
            "loss._target_=torch.nn.functional.mse_loss",
            "model._target_=torch.nn.Bilinear",
            "model.in1_features=2",
        ]
    )
    assert _section(cfg, "loss") == {"name": CUSTOM, "_target_": "torch.nn.functional.mse_loss"}
    assert _section(cfg, "model") == {"name": CUSTOM, "_target_": "torch.nn.Bilinear", "in1_features": 2}
    # A key of the recipe's target given on the command line, without a target, is added to it.
    cfg = compose([f"+recipe={recipe}", "model.out_features=3"])
    assert _section(cfg, "model")["_target_"] == "torch.nn.Linear"
    assert (_section(cfg, "model")["in_features"], _section(cfg, "model")["out_features"]) == (8, 3)


def test_the_shipped_example_with_loss_on_the_command_line_checks_as_that_loss(tmp_path):
    # The recipe's focal loss is its own code; on the command line cross_entropy replaces it,
    # so nothing of my_project.losses is left to trust.
    recipe = _recipe(
        tmp_path,
        "spirals",
        "data:\n  _target_: clorch.data.datasets.Blobs\nloss:\n  _target_: my_project.losses.focal\n  gamma: 2.0\n",
    )
    assert any("my_project" in e for e in check_overrides([f"+recipe={recipe}"]))
    assert check_overrides([f"+recipe={recipe}", "loss=cross_entropy"]) == []


def test_every_target_group_and_option_group_is_covered():
    assert set(TARGET_GROUPS) <= set(RECIPE_SETS) and set(OPTIONS) <= set(RECIPE_SETS)
