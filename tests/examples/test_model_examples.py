"""The model examples (examples/nanogpt, hf_causal_lm, resnet) train by their recipes alone on 2 gloo
ranks: one clorch-train sweep runs the three, each for a few steps, and each learns (its eval loss
falls below the loss of a uniform guess). A config mistake in nanoGPT's recipe is a config error
(exit 2) with the line of nanoGPT's code that failed."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
from pathlib import Path

import pytest

from tests.clirunner import run_clorch_train

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TRUSTED = "nanogpt,transformers,resnet_example"


def _prepare(root: Path) -> None:
    """The token files, written by the example's own prepare.py (as its README says to)."""
    spec = importlib.util.spec_from_file_location("prepare", EXAMPLES / "nanogpt" / "prepare.py")
    prepare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare)
    prepare.prepare(EXAMPLES / "nanogpt" / "nanogpt" / "model.py", root / "data")


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    """The three examples' packages and recipes side by side in one folder (one sweep runs them)."""
    root = tmp_path_factory.mktemp("model_examples")
    ignore = shutil.ignore_patterns("outputs", "multirun", "data", "__pycache__")
    shutil.copytree(EXAMPLES / "nanogpt" / "nanogpt", root / "nanogpt", ignore=ignore)
    shutil.copytree(EXAMPLES / "resnet" / "resnet_example", root / "resnet_example", ignore=ignore)
    for recipe in ("nanogpt/bytes.yaml", "hf_causal_lm/tiny_gpt2.yaml", "resnet/stripes.yaml"):
        shutil.copy(EXAMPLES / recipe, root)
    _prepare(root)
    return root


def _env(root: Path) -> dict[str, str]:
    return {**os.environ, "CLORCH_TRUSTED_MODULES": TRUSTED, "CLORCH_RECIPE_PATH": str(root)}


@pytest.mark.timeout(420)
def test_the_model_examples_train_by_their_recipes(examples):
    pytest.importorskip("transformers")
    sweep = run_clorch_train(
        ["-m", "+recipe=bytes,tiny_gpt2,stripes", "max_steps=12", "log_every=4"], examples, _env(examples), timeout=400
    )
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    (sweep_dir,) = (examples / "multirun").glob("*/*")
    chance = {0: math.log(256), 1: math.log(256), 2: math.log(4)}  # bytes, bytes, four classes
    for job, uniform in chance.items():
        summary = json.loads((sweep_dir / str(job) / "summary.json").read_text())
        assert summary["status"] == "succeeded" and summary["steps"] == 12, summary
        assert summary["final"]["eval_loss"] < uniform - 0.2, (job, summary["final"])


@pytest.mark.timeout(120)
def test_a_mistake_in_the_nanogpt_recipe_is_a_config_error_with_its_line(examples):
    # Without model.config._target_, GPT gets a plain mapping as its config.
    refused = run_clorch_train(["+recipe=bytes", "~model.config._target_"], examples, _env(examples), timeout=100)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "model._target_=nanogpt.model.GPT: cannot be built" in refused.stderr
    assert "model.config is a plain mapping" in refused.stderr
    model_py = examples / "nanogpt" / "model.py"
    line = next(
        i
        for i, text in enumerate(model_py.read_text().splitlines(), 1)
        if "assert config.vocab_size is not None" in text
    )
    assert f"{model_py}:{line}" in refused.stderr
    assert not (examples / "outputs").exists() or not any((examples / "outputs").rglob("summary.json"))
