"""Relative paths in a config are resolved once, against the directory `clorch-train` ran from,
also when hydra.job.chdir=true moves the job into its run directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from clorch.config.paths import with_absolute_paths
from tests.clirunner import run_clorch_train

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]


def test_relative_paths_become_absolute_and_words_stay(tmp_path):
    cfg = {
        "data": {"name": "text", "path": "corpus.txt"},
        "checkpoint": {"dir": "ckpt", "path": None, "resume": "latest"},
    }
    out = with_absolute_paths(cfg, tmp_path)
    assert out["data"]["path"] == str(tmp_path / "corpus.txt")
    assert out["checkpoint"] == {"dir": str(tmp_path / "ckpt"), "path": None, "resume": "latest"}
    assert cfg["data"]["path"] == "corpus.txt", "the caller's config is not changed"


def test_a_relative_data_path_is_read_from_where_the_user_ran_with_chdir(tmp_path):
    (tmp_path / "corpus.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 40)
    run_dir = tmp_path / "runs" / "one"
    done = run_clorch_train(
        [
            "data=text",
            "model=gpt",
            "data.path=corpus.txt",
            "data.seq_len=16",
            "batch_size=4",
            "epochs=1",
            "hydra.job.chdir=true",
            f"hydra.run.dir={run_dir}",
        ],
        tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
        timeout=100,
    )
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["data"]["path"] == str(tmp_path / "corpus.txt")
