"""The trackers' stores beside and inside run directories are not runs to clorch-runs."""

from __future__ import annotations

import json

import pytest

from clorch.runs.discover import find_runs

pytestmark = pytest.mark.timeout(30)


def _copies(directory):
    """What a tracker's store keeps of a run: its config.yaml and summary.json."""
    directory.mkdir(parents=True)
    (directory / "config.yaml").write_text("seed: 0\n")
    (directory / "summary.json").write_text(json.dumps({"status": "succeeded"}))


def test_mlflow_and_wandb_stores_are_not_listed_as_runs(tmp_path):
    run = tmp_path / "outputs" / "2026-12-04" / "10-00-00"
    _copies(run)
    (tmp_path / "mlflow.db").write_bytes(b"SQLite format 3\x00")  # MLflow's default store, beside outputs/
    _copies(tmp_path / "mlartifacts" / "1" / "0a1b2c" / "artifacts")
    _copies(tmp_path / "mlruns" / "1" / "0a1b2c" / "artifacts")
    _copies(tmp_path / "wandb" / "offline-run-1" / "files" / "clorch")  # WANDB_DIR=. (the project)
    _copies(tmp_path / "outputs" / "wandb" / "offline-run-2" / "files" / "clorch")
    assert [r.path for r in find_runs([tmp_path])] == [run.resolve()]
    assert [r.path for r in find_runs([tmp_path / "outputs"])] == [run.resolve()]
