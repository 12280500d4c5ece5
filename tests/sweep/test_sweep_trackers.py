"""A sweep's trials in the trackers: one MLflow parent run, named after the sweep directory, that
every trial's run is a child of; one W&B group. Trials side by side (each a clorch-train process
of its own, which gets the parent through its environment); the in-process trials of a sweep with
n_jobs=1 are checked in tests/engine/test_tracker_runs.py."""

from __future__ import annotations

import json

import pytest

from clorch.trackers import default_tracking_uri, run_name
from tests.clirunner import run_clorch_train
from tests.trackers_support import tracker_env, wandb_records_once_written

pytestmark = pytest.mark.timeout(300)
mlflow = pytest.importorskip("mlflow")
pytest.importorskip("wandb")


def test_the_trials_of_a_sweep_are_children_of_one_mlflow_run_and_one_wandb_group(tmp_path, monkeypatch):
    args = ["-m", "+recipe=cpu_smoke", "launcher.nproc_per_node=1", "max_steps=4", "seed=1,2"]
    trackers = ["logger.trackers=[mlflow,wandb]", "logger.mode=offline", "hydra.sweeper.n_jobs=2"]
    done = run_clorch_train(
        [*args, *trackers], tmp_path, env={**tracker_env(tmp_path), "OMP_NUM_THREADS": "1"}, timeout=240
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (sweep_dir,) = (tmp_path / "multirun").glob("*/*")
    sweep = run_name(sweep_dir)  # "DATE/TIME", as its trials are "DATE/TIME/N"

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    store = mlflow.MlflowClient(default_tracking_uri(sweep_dir / "0"))
    runs = store.search_runs([store.get_experiment_by_name("clorch").experiment_id])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert (parent.info.run_name, parent.info.status) == (sweep, "FINISHED")
    children = {r.info.run_name: r for r in runs if r is not parent}
    assert sorted(children) == [f"{sweep}/0", f"{sweep}/1"]
    for child in children.values():
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert (child.info.status, child.data.params["seed"]) in {("FINISHED", "1"), ("FINISHED", "2")}

    for number in (0, 1):
        assert json.loads((sweep_dir / str(number) / "summary.json").read_text())["status"] == "succeeded"
        (log,) = (sweep_dir / str(number) / "wandb").glob("offline-run-*/run-*.wandb")
        (run,) = [r.run for r in wandb_records_once_written(log) if r.HasField("run")]
        assert (run.display_name, run.run_group) == (f"{sweep}/{number}", sweep)
