"""Your own model from the command line: the person who runs the job names the modules it
trusts (CLORCH_TRUSTED_MODULES, or an installed package's entry point), never a config file;
the working directory is importable for them, as with `python -m`."""

from __future__ import annotations

import json

import os
import textwrap
from pathlib import Path

import pytest
import yaml

from clorch.config.targets import TRUSTED_VARIABLE, check_target, trusted_module_errors, trusted_modules
from tests.clirunner import run_clorch_train

pytestmark = pytest.mark.timeout(180)

NET = textwrap.dedent('''\
    import torch


    class Net(torch.nn.Module):
        """A model of the user's: it takes the data's sizes by name, and a width of its own."""

        def __init__(self, in_features: int, out_features: int, width: int = 16):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(in_features, width), torch.nn.ReLU(),
                                            torch.nn.Linear(width, out_features))

        def forward(self, x):
            return self.body(x)
    ''')


def _project(root: Path) -> Path:
    """A package of the user's, `my_project.models.Net`, in `root` (not installed)."""
    (root / "my_project").mkdir()
    (root / "my_project" / "__init__.py").write_text("")
    (root / "my_project" / "models.py").write_text(NET)
    return root


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != TRUSTED_VARIABLE}
    return {**env, **extra}


def test_the_environment_names_trusted_modules_and_bad_names_are_errors():
    found = trusted_modules({TRUSTED_VARIABLE: " my_project, other.pkg ,,bad name"})
    assert found[TRUSTED_VARIABLE] == ["my_project", "other.pkg"]
    errors = trusted_module_errors({TRUSTED_VARIABLE: "my_project,bad name"})
    assert len(errors) == 1 and "'bad name'" in errors[0] and TRUSTED_VARIABLE in errors[0]


def test_an_untrusted_target_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.delenv(TRUSTED_VARIABLE, raising=False)
    errors = check_target("model._target_", "my_project.models.Net")
    assert len(errors) == 1
    assert f"{TRUSTED_VARIABLE}=my_project clorch-train" in errors[0]
    assert "a config file cannot extend this list" in errors[0]


def test_a_trusted_module_still_cannot_reach_past_itself(monkeypatch):
    """The resolved object's own module must be trusted, not just the dotted path's start."""
    monkeypatch.setenv(TRUSTED_VARIABLE, "logging")
    errors = check_target("model._target_", "logging.os.system")
    assert errors and "resolves to posix.system" in errors[0]


def test_without_the_variable_clorch_train_refuses_the_users_model(tmp_path):
    root = _project(tmp_path)
    done = run_clorch_train(["+recipe=cpu_smoke", "model._target_=my_project.models.Net"], cwd=root, env=_env())
    assert done.returncode == 2, done.stderr
    assert f"{TRUSTED_VARIABLE}=my_project" in done.stderr
    assert not (root / "outputs").exists() or not any((root / "outputs").rglob("config.yaml"))


def test_a_trusted_model_from_the_working_directory_trains_on_two_ranks(tmp_path):
    """No `~model.hidden_features` needed: naming a _target_ replaces the built-in option."""
    root = _project(tmp_path)
    done = run_clorch_train(
        [
            "+recipe=cpu_smoke",
            "model._target_=my_project.models.Net",
            "model.width=8",
            "logger.progress=off",
            "hydra.run.dir=run",
        ],
        cwd=root,
        env=_env(**{TRUSTED_VARIABLE: "my_project"}),
    )
    assert done.returncode == 0, done.stderr
    assert "succeeded" in done.stderr + done.stdout
    text = (root / "run" / "config.yaml").read_text()
    config = yaml.safe_load(text)
    assert config["model"] == {"_target_": "my_project.models.Net", "width": 8}
    # Who trusted what is part of the run's record.
    assert text.startswith(f"# trusted modules ({TRUSTED_VARIABLE}): my_project\n")
    summary = json.loads((root / "run" / "summary.json").read_text())
    assert summary["trusted_modules"] == {TRUSTED_VARIABLE: ["my_project"]}
    printed = run_clorch_train(
        ["+recipe=cpu_smoke", "model._target_=my_project.models.Net", "--cfg", "job"],
        cwd=root,
        env=_env(**{TRUSTED_VARIABLE: "my_project"}),
    )
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.startswith(f"# trusted modules ({TRUSTED_VARIABLE}): my_project\n")
    assert yaml.safe_load(printed.stdout)["model"]["_target_"] == "my_project.models.Net"


def test_a_recipe_naming_a_target_selects_the_custom_option(tmp_path):
    recipe = tmp_path / "linear.yaml"
    recipe.write_text("# @package _global_\nmodel:\n  _target_: torch.nn.Linear\n  bias: false\n")
    done = run_clorch_train([f"+recipe={recipe}", "--cfg", "job"], cwd=tmp_path, env=_env())
    assert done.returncode == 0, done.stderr
    model = yaml.safe_load(done.stdout)["model"]
    assert model["_target_"] == "torch.nn.Linear" and model["bias"] is False
    assert "hidden_features" not in model
