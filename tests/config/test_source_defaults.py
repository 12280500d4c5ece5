"""Defaults read from source equal the classes' own, and composing a config imports no torch."""

from __future__ import annotations

import dataclasses
import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from clorch.config.options import data, ddp, launcher, model, precision, sampler
from clorch.config.source_defaults import source_constant, source_default

ROOT = Path(__file__).resolve().parents[2]
OWNERS = [
    tuple(reference.split(":"))  # "module:Class", as the options name them
    for reference in (
        precision.SCALER,
        sampler.SAMPLER,
        ddp.DDP,
        model.MLP,
        model.GPT,
        data.SYNTHETIC,
        data.ARITHMETIC,
        data.TEXT,
        data.TOKENS,
        launcher.LAUNCH,
    )
]


def _imported(module: str, name: str):
    import importlib

    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("owner", OWNERS, ids=lambda o: o[1])
def test_every_default_read_from_source_is_the_imported_ones(owner):
    obj = _imported(*owner)
    if dataclasses.is_dataclass(obj):
        own = {f.name: f.default for f in dataclasses.fields(obj) if f.default is not dataclasses.MISSING}
    else:
        target = obj.__init__ if inspect.isclass(obj) else obj
        own = {
            k: p.default
            for k, p in inspect.signature(target).parameters.items()
            if p.default is not inspect.Parameter.empty
        }
    assert own
    for name, value in own.items():
        assert source_default(*owner, name) == value, name


def test_constants_read_from_source():
    from clorch.launch.config import MAX_SECONDS
    from clorch.nn.parallel.ddp import DEFAULT_BUCKET_CAP_MB

    assert source_constant("clorch.launch.config", "MAX_SECONDS") == MAX_SECONDS
    assert source_constant("clorch.nn.parallel.ddp", "DEFAULT_BUCKET_CAP_MB") == DEFAULT_BUCKET_CAP_MB


def test_what_cannot_be_read_is_an_error_not_a_guess(tmp_path, monkeypatch):
    package = tmp_path / "made_up_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "things.py").write_text(
        "import os\nLIMIT = 2 ** 10\ndef build(size=LIMIT * 2, where=os.getcwd(), *, name='x'):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert source_default("made_up_pkg.things", "build", "size") == 2048
    assert source_default("made_up_pkg.things", "build", "name") == "x"
    with pytest.raises(TypeError, match="'os.getcwd\\(\\)' is not a constant"):
        source_default("made_up_pkg.things", "build", "where")
    with pytest.raises(LookupError, match="no default for 'module'"):
        source_default("clorch.nn.parallel.ddp", "DistributedDataParallel", "module")
    with pytest.raises(LookupError, match="defines no Nothing"):
        source_default("clorch.amp.scaler", "Nothing", "x")


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


@pytest.mark.timeout(120)
def test_clorch_train_help_and_cfg_job_import_no_torch(tmp_path):
    import json

    commands = [
        ["--help"],
        ["--version"],
        ["+recipe=ddp_fp16", "--help"],
        ["--cfg", "job"],
        ["+recipe=gpt_bf16", "--cfg", "job"],
        ["checkpoint=periodic", "checkpoint.dir=ckpt", "--cfg", "job"],
        ["data=tokens", "optim.lr=-1", "--cfg", "job"],
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _BLOCKED, json.dumps(commands)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    exits = [line for line in done.stdout.splitlines() if line.startswith("EXIT")]
    assert exits == ["EXIT 0 False"] * 6 + ["EXIT 2 False"], done.stdout + done.stderr
    assert "optim.lr must be > 0, got -1" in done.stderr and "data.train_path" in done.stderr
