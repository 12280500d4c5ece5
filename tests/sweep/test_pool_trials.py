"""Trials side by side (hydra.sweeper.n_jobs > 1) are the trials a sweep would run one at a time:
the same recipe file, the same global batch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from clorch.config.composer import register_recipe_path
from clorch.sweep.pool import sized_to_slot, trial_args
from clorch.sweep.slots import Slot, plan_slots, ranks_per_trial

ROOT = Path(__file__).resolve().parents[2]
# cpu_smoke's model and data, ranks left to `auto` (2 CPU ranks for a run alone).
RECIPE = """# @package _global_
defaults:
  - override /backend: gloo
  - override /precision: fp32
  - override /model: mlp
  - override /data: synthetic
batch_size: 4
max_steps: 2
model:
  hidden_features: 8
data:
  sample_count: 32
  in_features: 8
  out_features: 4
"""


def test_a_recipe_file_reaches_a_trial_as_its_path(tmp_path):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(RECIPE)
    name = register_recipe_path(str(recipe))  # as clorch-train registers +recipe=./tiny.yaml
    args = trial_args([f"+recipe={name}", "seed=1"], tmp_path / "0", [])
    assert args[:2] == [f"+recipe={recipe}", "seed=1"]


@pytest.mark.parametrize(
    ("gpus", "cores", "n_jobs", "ranks"),
    [
        ([], list(range(16)), 2, 2),  # never more ranks than a run alone (2 on CPU)
        ([], [0, 1], 2, 1),
        ([str(g) for g in range(8)], [], 3, 2),  # a divisor of the 8 a run alone has
        ([str(g) for g in range(6)], [], 4, 1),
    ],
)
def test_auto_ranks_divide_a_lone_runs(gpus, cores, n_jobs, ranks):
    assert ranks_per_trial("auto", n_jobs, gpus, cores) == ranks


def test_an_auto_trial_on_fewer_ranks_accumulates_to_a_lone_runs_global_batch(tmp_path):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(RECIPE + "accumulation: 3\n")
    (slot, _) = plan_slots(2, ranks_per_trial("auto", 2, [], [0, 1]), [], [0, 1])
    overrides, change = sized_to_slot([f"+recipe={recipe}", "seed=1"], slot)
    assert overrides[-2:] == ["launcher.nproc_per_node=1", "accumulation=6"]
    assert "a run alone" in change and "the same global batch" in change
    # ranks given as a number, or a slot of a lone run's ranks: nothing changes
    assert sized_to_slot([f"+recipe={recipe}", "launcher.nproc_per_node=1"], slot) == (
        [f"+recipe={recipe}", "launcher.nproc_per_node=1"],
        None,
    )
    assert sized_to_slot([f"+recipe={recipe}"], Slot(0, (), (0, 1), 2)) == ([f"+recipe={recipe}"], None)


@pytest.mark.timeout(200)
def test_a_recipe_file_sweep_side_by_side_keeps_a_lone_runs_global_batch(tmp_path):
    """`+recipe=./tiny.yaml launcher.nproc_per_node=auto hydra.sweeper.n_jobs=2` on 2 cores: each trial
    finds its recipe, and runs 1 rank accumulating 2 micro-batches (a run alone: 2 ranks)."""
    (tmp_path / "tiny.yaml").write_text(RECIPE)
    args = ["-m", "+recipe=./tiny.yaml", "launcher.nproc_per_node=auto", "seed=1,2", "hydra.sweeper.n_jobs=2"]
    two_cores = sorted(os.sched_getaffinity(0))[:2]
    if len(two_cores) < 2:
        pytest.skip("needs 2 CPU cores")
    done = subprocess.run(
        [sys.executable, "-m", "clorch.cli", *args, "hydra.sweep.dir=sweep"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=180,
        preexec_fn=lambda: os.sched_setaffinity(0, two_cores),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "accumulation=2: the same global batch" in done.stdout
    for trial in ("0", "1"):
        config = yaml.safe_load((tmp_path / "sweep" / trial / "config.yaml").read_text())
        assert (config["launcher"]["nproc_per_node"], config["accumulation"]) == (1, 2)
        assert "succeeded" in (tmp_path / "sweep" / trial / "summary.json").read_text()
