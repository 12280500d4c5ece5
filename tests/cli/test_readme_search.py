"""The README's search command works as printed on a 2-core machine, and its trials can be pruned."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from clorch.cli.train import _errors_before_hydra
from clorch.config.composer import compose, rewrite_recipe_overrides

README = Path(__file__).resolve().parents[2] / "README.md"


def _search_command() -> list[str]:
    text = README.read_text().replace("\\\n", " ")
    (line,) = [x for x in text.splitlines() if x.startswith("clorch-train -m") and "hydra/sweeper=optuna" in x]
    return shlex.split(line.partition("#")[0])[1:]


def test_the_readme_search_passes_every_check_on_two_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    args = _search_command()
    overrides = [a for a in args if a != "-m"]
    assert _errors_before_hydra(rewrite_recipe_overrides(overrides), {"-m"}, multirun=True) == []


def test_the_readme_search_evaluates_before_its_last_step():
    """A pruner decides at evals: a trial must evaluate before it ends."""
    args = [a for a in _search_command() if a != "-m" and not a.startswith("hydra")]
    searched = [a for a in args if re.search(r"\b(interval|choice|range)\(", a)]
    config = compose([a for a in args if a not in searched])
    ranks = config.launcher.nproc_per_node
    steps = config.epochs * config.data.sample_count // (config.batch_size * ranks * config.accumulation)
    assert 0 < config.eval_every < steps
