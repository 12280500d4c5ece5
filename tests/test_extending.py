"""docs/extending.md's examples, added to a copy of clorch exactly as the page writes them, then used.

The copy is this checkout's clorch/ package and docs/ in a temporary folder, with
the page's files (each a ```python block whose first line names its path under
clorch/) written into it and conf/ regenerated, as a maintainer would. One job
then trains with every example at once; the checks of the new options run
in-process in a fresh interpreter on the copy.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "extending.md"
_FILE_BLOCK = re.compile(r"^```python\n# (?P<path>clorch/\S+\.py)\n(?P<code>.*?)^```[ \t]*$", re.S | re.M)
# The model example: a class of the user's own, named by model._target_ (no change to clorch).
MY_MODELS = '''
import torch
from torch import nn


class Wide(nn.Module):
    def __init__(self, in_features, out_features, width=32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, width), nn.ReLU(), nn.Linear(width, out_features))

    def forward(self, x):
        return self.net(x)
'''


def page_files() -> dict[str, str]:
    """Path under the checkout -> the file's text, for each file the page adds to clorch."""
    return {m.group("path"): f"# {m.group('path')}\n{m.group('code')}" for m in _FILE_BLOCK.finditer(PAGE.read_text())}


def _env(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(PYTHONPATH=str(tree), OMP_NUM_THREADS="1", CLORCH_TRUSTED_MODULES="my_models", PYTHONUNBUFFERED="1")
    return env


def _python(tree: Path, *args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=_env(tree), capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of clorch with the page's files added and conf/ and docs/keys.md written again."""
    root = tmp_path_factory.mktemp("extended")
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "clorch", root / "clorch", ignore=ignore)  # conf/ and recipes/ links copied as folders
    shutil.copytree(ROOT / "docs", root / "docs", ignore=ignore)
    for path, text in page_files().items():
        (root / path).write_text(text)
    (root / "work").mkdir()
    (root / "work" / "my_models.py").write_text(MY_MODELS)
    done = _python(
        root, "-m", "clorch.config.conf_files", "--dir", str(root / "clorch" / "conf"), "--docs", str(root / "docs"),
        cwd=root,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return root


def test_the_page_adds_an_option_a_task_and_its_option_and_a_tracker():
    assert sorted(page_files()) == [
        "clorch/config/options/adam.py",
        "clorch/config/options/parity.py",
        "clorch/config/options/torch_ddp.py",
        "clorch/data/parity.py",
        "clorch/strategies/torch_ddp.py",
        "clorch/trackers/csv_tracker.py",
    ]


@pytest.mark.timeout(300)
def test_the_new_options_get_their_yaml_and_their_keys_page(tree):
    assert "name: adam" in (tree / "clorch" / "conf" / "optim" / "adam.yaml").read_text()
    assert "bits: 8" in (tree / "clorch" / "conf" / "data" / "parity.yaml").read_text()
    keys = (tree / "docs" / "keys.md").read_text()
    assert "### `optim=adam`" in keys and "`data.bits`" in keys and "### `logger=csv`" in keys
    assert "bucket_cap_mb: 25.0" in (tree / "clorch" / "conf" / "parallel" / "torch_ddp.yaml").read_text()
    assert "### `parallel=torch_ddp`" in keys


@pytest.mark.timeout(300)
def test_the_new_options_are_checked_and_built(tree):
    script = """
from clorch.config import check_config, compose
from clorch.data.tasks import build_task
print(check_config(compose(["data=parity", "model=gpt"])))
print(check_config(compose(["optim=adam", "optim.betas=[0.9]", "data=parity"])))
print(check_config(compose(["optim=adam", "data=parity", "data.bits=0"])))
print(len(build_task("parity", split="eval", seed=0, sample_count=20)))
print(check_config(compose(["parallel=torch_ddp", "parallel.bucket_cap_mb=0"])))
"""
    done = _python(tree, "-c", script, cwd=tree / "work")
    assert done.returncode == 0, done.stderr
    gpt, betas, bits, size, bucket = done.stdout.strip().splitlines()
    assert "model=gpt cannot train data=parity: use model=mlp" in gpt
    assert "optim.betas" in betas and "in [0, 1)" in betas
    assert "data.bits" in bits and ">= 1" in bits
    assert size == "20"
    assert "parallel.bucket_cap_mb" in bucket and "> 0" in bucket


@pytest.mark.timeout(300)
def test_one_job_trains_with_every_example(tree):
    run_dir = tree / "work" / "run"
    done = _python(
        tree, "-m", "clorch.cli",
        "optim=adam", "data=parity", "data.sample_count=256", "model._target_=my_models.Wide", "model.width=16",
        "batch_size=16", "max_steps=6", "log_every=2", "logger=csv", "launcher.nproc_per_node=2",
        "parallel=torch_ddp", "parallel.bucket_cap_mb=1", "checkpoint=periodic", "checkpoint.every_n_steps=3",
        f"hydra.run.dir={run_dir}",
        cwd=tree / "work",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["steps"] == 6
    assert 0.0 <= summary["final"]["eval_accuracy"] <= 1.0
    # parallel=torch_ddp trained it (torch's DistributedDataParallel) and wrote parallel=ddp's checkpoint files.
    assert "name: torch_ddp" in (run_dir / "config.yaml").read_text()
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("*.ckpt")) == [
        "final.ckpt", "step_00000003.ckpt", "step_00000006.ckpt"
    ]  # fmt: skip
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    assert rows[0] == "step,name,value" and any(row.startswith("6,") and "accuracy" in row for row in rows), rows
