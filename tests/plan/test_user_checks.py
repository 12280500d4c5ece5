"""Mistakes in your own code and weights that clorch-train refuses before launch, each with the fix:
a parameter without a gradient (a backward runs before launch under parallel=ddp), a built-in
model that your dataset does not size, a model key a factory's **kwargs rejects, a warmup longer
than the run, a `model.init_from` folder; and a typo reported before torch is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from clorch.config.overrides import check_overrides
from clorch.plan.plan import resolve_errors
from tests.clirunner import run_clorch_train_batch

pytestmark = pytest.mark.timeout(150)
ROOT = Path(__file__).resolve().parents[2]

CODE = '''
import torch
from torch import nn
from torch.utils.data import Dataset

class Spare(nn.Module):
    """A layer that forward never uses: it gets no gradient."""
    def __init__(self, in_features, out_features):
        super().__init__()
        self.used = nn.Linear(in_features, out_features)
        self.spare = nn.Linear(in_features, out_features)

    def forward(self, x):
        return self.used(x)

class Frozen(Spare):
    """The same layer, frozen: allowed."""
    def __init__(self, in_features, out_features):
        super().__init__(in_features, out_features)
        self.spare.requires_grad_(False)

class Points(Dataset):
    """Five features, three classes, and no model_kwargs(): a built-in model cannot size itself."""
    def __init__(self):
        self.x, self.y = torch.randn(64, 5), torch.randint(0, 3, (64,))

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return self.x[i], self.y[i]

class Head(nn.Module):
    def __init__(self, width=3):
        super().__init__()
        self.layer = nn.Linear(5, width)

    def forward(self, x):
        return self.layer(x)

def create_model(arch, **kwargs):
    """A factory that hands its **kwargs on, as timm.create_model does."""
    return Head(**kwargs)

class Tied(nn.Module):
    """Two matrices tied into one, as GPT-2's lm_head is to its token embedding (tie=False: not)."""
    def __init__(self, in_features, out_features, tie=True):
        super().__init__()
        self.encode = nn.Linear(in_features, in_features, bias=False)
        self.decode = nn.Linear(in_features, in_features, bias=False)
        if tie:
            self.decode.weight = self.encode.weight
        self.head = nn.Linear(in_features, out_features)

    def forward(self, x):
        return self.head(self.decode(torch.tanh(self.encode(x))))
'''

SMOKE = ["+recipe=cpu_smoke", "max_steps=2"]
POINTS = ["+recipe=cpu_smoke", "data._target_=userchk.Points", "loss=cross_entropy"]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A project directory holding the package `userchk`, which the commands trust."""
    where = tmp_path_factory.mktemp("project")
    (where / "userchk").mkdir()
    (where / "userchk" / "__init__.py").write_text(CODE)
    return where


@pytest.fixture
def user_code(project, monkeypatch):
    monkeypatch.chdir(project)
    monkeypatch.setenv("CLORCH_TRUSTED_MODULES", "userchk")
    yield
    for name in [m for m in sys.modules if m == "userchk" or m.startswith("userchk.")]:
        del sys.modules[name]


CLI = {
    "spare": [*SMOKE, "++model._target_=userchk.Spare"],
    "spare_on_points": [*POINTS, "++model._target_=userchk.Spare", "++model.in_features=5", "++model.out_features=3"],
    "mlp_on_points": POINTS,
    "factory_typo": [*POINTS, "++model._target_=userchk.create_model", "++model.arch=small", "++model.widht=3"],
    "warmup": ["+recipe=gpt_bf16", "max_steps=2", "backend=gloo", "precision=fp32"],
    "no_weights_folder": [*SMOKE, "model.init_from=empty_folder"],
}


@pytest.fixture(scope="module")
def cli(project) -> dict[str, subprocess.CompletedProcess]:
    """clorch-train's result for each command of CLI, one after the other in one process
    (tests.clirunner.run_clorch_train_batch), in the project directory."""
    (project / "empty_folder").mkdir()
    env = {**os.environ, "CLORCH_TRUSTED_MODULES": "userchk", "PYTHONWARNINGS": "ignore"}
    done = run_clorch_train_batch([(args, project) for args in CLI.values()], env, timeout=140)
    return dict(zip(CLI, done))


def _refused(done: subprocess.CompletedProcess, *parts: str) -> str:
    assert done.returncode == 2, done.stderr
    assert "nothing was launched" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert all(p in done.stderr for p in parts), done.stderr
    return done.stderr


def test_a_parameter_without_a_gradient_is_named_before_launch_under_ddp(cli, project):
    fix = "remove them from the model, or freeze them (param.requires_grad_(False)"
    _refused(
        cli["spare"],
        "model._target_=userchk.Spare: 2 trainable parameter(s) get no gradient",
        "(a backward tried before launch): spare.weight, spare.bias",
        fix,
    )
    _refused(cli["spare_on_points"], "get no gradient from a batch of data._target_=userchk.Points", fix)
    assert not (project / "outputs").exists()


def test_frozen_parameters_and_fsdp_pass_the_gradient_check(user_code):
    assert resolve_errors_of(*SMOKE, "++model._target_=userchk.Frozen") == []
    assert resolve_errors_of(*SMOKE, "++model._target_=userchk.Spare", "parallel=fsdp") == []


def resolve_errors_of(*overrides: str) -> list[str]:
    return check_overrides(list(overrides), resolve_errors)


def test_a_builtin_model_your_dataset_does_not_size_names_model_kwargs(cli):
    _refused(
        cli["mlp_on_points"],
        "mat1 and mat2 shapes cannot be multiplied",
        "model=mlp takes its sizes (in_features, out_features) from the dataset's model_kwargs()",
        "built with its defaults (in_features=128, out_features=32)",
        "def model_kwargs(self): return {'in_features': ..., 'out_features': ...}",
    )


def test_a_key_a_factory_rejects_through_its_kwargs_is_named(cli):
    found = _refused(
        cli["factory_typo"],
        "model.widht=3 reaches userchk.create_model through its **kwargs",
        "has no argument 'widht'",
    )
    assert "name your model with model._target_" not in found and "model_kwargs" not in found


def test_a_warmup_longer_than_the_run_suggests_a_shorter_one(cli):
    _refused(
        cli["warmup"],
        "schedule.warmup_steps=50 must be < the run's 2 optimizer steps",
        "set schedule.warmup_steps below 2 (e.g. schedule.warmup_steps=0)",
    )


def test_a_folder_without_weights_names_what_a_pretrained_folder_holds(cli):
    _refused(
        cli["no_weights_folder"],
        "empty_folder is a directory without model weights",
        "model.safetensors or pytorch_model.bin",
    )


def test_a_pretrained_folder_with_its_tied_weight_left_out_fits(user_code, project):
    from safetensors.torch import save_file

    from userchk import Tied

    folder = project / "tied"
    folder.mkdir(exist_ok=True)
    state = Tied(8, 4).state_dict()
    save_file({k: v for k, v in state.items() if k != "decode.weight"}, folder / "model.safetensors")
    tied = [*SMOKE, "++model._target_=userchk.Tied", f"++model.init_from={folder}"]
    assert resolve_errors_of(*tied) == []
    # Untied, decode.weight is the model's own: missing from the file, and the error says how
    # to load the rest.
    errors = resolve_errors_of(*tied, "++model.tie=false")
    assert any("decode.weight; model.init_strict=false" in e for e in errors), errors
    assert resolve_errors_of(*tied, "++model.tie=false", "++model.init_strict=false") == []


_BLOCKED = textwrap.dedent("""
    import json, sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError("torch is blocked here")
    sys.meta_path.insert(0, Block())
    from clorch.cli import train_main
    for args in json.loads(sys.argv[1]):
        code = train_main(args)
        print("EXIT", code, "torch" in sys.modules)
""")


def test_a_typo_is_reported_before_torch_is_imported(tmp_path):
    commands = [["optim.lrr=0.1"], ["+recipe=cpu_smoke", "batch_size=abc"], ["-m", "optim.lrr=0.1,0.2"]]
    done = subprocess.run(
        [sys.executable, "-c", _BLOCKED, json.dumps(commands)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=100,
    )
    exits = [line for line in done.stdout.splitlines() if line.startswith("EXIT")]
    assert exits == ["EXIT 2 False"] * 3, done.stdout + done.stderr
    assert done.stderr.count("optim.lrr is not a known key; did you mean lr?") == 2, done.stderr
    assert "batch_size must be int, got 'abc'" in done.stderr
    assert list(tmp_path.iterdir()) == []
