"""Experiment trackers fed by `clorch-train`: what MLflow and W&B hold after real runs.

Two launches for the module: a sweep of two jobs under clorch's launcher (job 0 sends to
MLflow's default store and W&B offline, job 1 to an MLflow server nothing listens for), and a
`launcher=torchrun` run interrupted mid-run. MLflow's store is read back with MLflow's own
MlflowClient. Then, in-process: the feed keeps what an interrupt cut short, and the progress
view hands every record over, also with progress=off.
"""

from __future__ import annotations

import io
import json
import signal
import time
from pathlib import Path

import pytest
import yaml

from clorch.engine.progress import Progress
from clorch.engine.tracking import TrackerFeed
from clorch.trackers import default_tracking_uri, flatten, record_metrics
from tests.clirunner import run_clorch_train, start_clorch_train
from tests.harness import free_port
from tests.trackers_support import tracker_env

pytestmark = pytest.mark.timeout(300)
mlflow = pytest.importorskip("mlflow")
pytest.importorskip("wandb")
TRACKER_LINE = "mlflow tracker:"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A 2-job sweep in a fresh project directory: (project, sweep dir, port, the finished process)."""
    project = tmp_path_factory.mktemp("project")
    port = free_port()  # bound and released: nothing listens there
    proc = run_clorch_train(
        [
            "-m",
            "+recipe=cpu_smoke",
            "logger.trackers=[mlflow,wandb]",
            "logger.mode=offline",
            f"logger.tracking_uri=null,http://127.0.0.1:{port}",
        ],
        project,
        env=tracker_env(project),
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (sweep_dir,) = (project / "multirun").glob("*/*")
    return project, sweep_dir, port, proc


@pytest.fixture
def client(monkeypatch):
    """A reader of MLflow's stores: MLflow's own client, without settings (no MLFLOW_ALLOW_FILE_STORE)."""
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    return lambda uri: mlflow.MlflowClient(tracking_uri=uri)


def _expected_params(run_dir: Path) -> dict[str, str]:
    """config.yaml as MLflow holds it: dotted keys, lists as JSON, other values as str, no nulls."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    return {k: json.dumps(v) if isinstance(v, list) else str(v) for k, v in flatten(config).items() if v is not None}


def _expected_histories(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Each metric's (step, value) points, from metrics.jsonl, in the file's order."""
    histories: dict[str, list[tuple[int, float]]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        step, numbers = record_metrics(json.loads(line))
        for key, value in numbers.items():
            histories.setdefault(key, []).append((step, value))
    return histories


def _check_mlflow_run(client, run, run_dir: Path, status: str) -> None:
    assert run.info.status == status
    assert run.data.tags["clorch.run_dir"] == str(run_dir)
    assert run.data.params == _expected_params(run_dir)
    expected = _expected_histories(run_dir)
    assert expected["train/loss"] and set(run.data.metrics) == set(expected)
    for key, points in expected.items():
        assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)] == points, key
    assert {"config.yaml", "summary.json"} <= {f.path for f in client.list_artifacts(run.info.run_id)}


def test_a_sweep_job_reaches_mlflow_and_wandb(sweep, client):
    project, sweep_dir, _, _ = sweep
    job = sweep_dir / "0"
    # One store for every run and sweep of the project, beside outputs/ and multirun/.
    assert default_tracking_uri(job) == f"sqlite:///{project / 'mlflow.db'}"
    store = client(default_tracking_uri(job))
    experiment = store.get_experiment_by_name("clorch")
    runs = store.search_runs([experiment.experiment_id])  # job 1's MLflow server was not there
    # The sweep's parent run, named after it, and job 0's run, its child (in-process trials: n_jobs=1).
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    (run,) = [r for r in runs if r is not parent]
    assert (parent.info.run_name, parent.info.status) == (f"{sweep_dir.parent.name}/{sweep_dir.name}", "FINISHED")
    assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert run.info.run_name == f"{sweep_dir.parent.name}/{sweep_dir.name}/0"
    _check_mlflow_run(store, run, job, "FINISHED")

    (offline,) = (job / "wandb").glob("offline-run-*")
    assert list(offline.glob("run-*.wandb"))
    assert {"config.yaml", "summary.json"} <= {p.name for p in (offline / "files" / "clorch").iterdir()}


def test_an_unreachable_tracking_server_warns_once_and_the_run_succeeds(sweep):
    _, sweep_dir, port, proc = sweep
    job = sweep_dir / "1"
    assert json.loads((job / "summary.json").read_text())["status"] == "succeeded"
    (line,) = [x for x in (proc.stdout + proc.stderr).splitlines() if TRACKER_LINE in x]
    assert f"{TRACKER_LINE} start failed (MlflowException: " in line and f"127.0.0.1:{port}" in line
    assert line.endswith("it is off for the rest of this run, training goes on")
    assert "Traceback" not in proc.stdout + proc.stderr
    assert list((job / "wandb").glob("offline-run-*"))  # the other tracker went on


def test_an_interrupted_torchrun_run_is_killed_in_mlflow_with_all_its_records(tmp_path, client):
    run_dir = tmp_path / "outputs" / "interrupted"
    proc = start_clorch_train(
        [
            "+recipe=cpu_smoke",
            "epochs=5000",
            "launcher=torchrun",
            "launcher.nproc_per_node=2",
            f"launcher.rdzv_endpoint=127.0.0.1:{free_port()}",
            "logger.trackers=[mlflow]",
            f"hydra.run.dir={run_dir}",
        ],
        tmp_path,
        env=tracker_env(tmp_path),
    )
    deadline = time.monotonic() + 120
    metrics = run_dir / "metrics.jsonl"
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 3):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no metrics within 120 s"
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, stderr
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    store = client(default_tracking_uri(run_dir))
    (run,) = store.search_runs([store.get_experiment_by_name("clorch").experiment_id])
    assert run.info.run_name == "interrupted"
    _check_mlflow_run(store, run, run_dir, "KILLED")


class _Tracker:
    """A tracker that records its calls; `cut` makes its next log raise an interrupt."""

    name = "fake"

    def __init__(self):
        self.calls, self.cut = [], False

    def start(self, params):
        self.calls.append(("start", params))

    def log(self, record):
        if self.cut:
            self.cut = False
            raise KeyboardInterrupt
        self.calls.append(("log", record["step"]))

    def finish(self, status, artifacts):
        self.calls.append(("finish", status, [p.name for p in artifacts]))


@pytest.mark.timeout(10)
def test_the_feed_sends_what_an_interrupt_cut_short_once(tmp_path):
    first, second = _Tracker(), _Tracker()
    feed = TrackerFeed([first, second], {"seed": 1})
    feed.start()
    second.cut = True
    with pytest.raises(KeyboardInterrupt):
        feed.log([{"step": 1}, {"step": 2}])
    feed.log([{"step": 3}])
    feed.finish("interrupted", tmp_path)
    end = ("finish", "interrupted", ["config.yaml", "summary.json", "loss.png"])
    assert first.calls == second.calls == [("start", {"seed": 1}), ("log", 1), ("log", 2), ("log", 3), end]


@pytest.mark.timeout(10)
def test_a_tracker_not_started_before_an_interrupt_is_left_out(tmp_path):
    class Slow(_Tracker):
        def start(self, params):
            raise KeyboardInterrupt  # Ctrl-C while its package imports or its server answers

    slow, later = Slow(), _Tracker()
    feed = TrackerFeed([slow, later], {})
    with pytest.raises(KeyboardInterrupt):
        feed.start()
    feed.log([{"step": 1}])
    feed.finish("interrupted", tmp_path)
    assert [c[0] for c in slow.calls] == ["log", "finish"] and later.calls == []


@pytest.mark.timeout(10)
def test_progress_hands_over_every_record_once_also_when_off(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"kind": "train", "step": s, "loss": 1 / s}) + "\n" for s in (2, 4, 6)]
    shown = io.StringIO()
    quiet = Progress(path, total_steps=6, mode="off", stream=shown)
    lines_view = Progress(path, total_steps=6, mode="lines", stream=shown)
    # A resume announces the record it carries over from the run it resumed, then writes it.
    (tmp_path / "events.jsonl").write_text(json.dumps({"message": "resumed", "carried_records": 1}) + "\n")
    path.write_text(lines[0] + lines[1])
    assert [r["step"] for r in quiet.poll()] == [2, 4]
    path.write_text(lines[0])  # a restart rewrote the file back to step 2, then went on
    with open(path, "a") as f:
        f.write(lines[1] + lines[2])
    assert [r["step"] for r in quiet.close()] == [6]
    assert shown.getvalue() == ""
    # The carried-over record goes to the trackers (it is the run's history) but is not shown again.
    assert [r["step"] for r in lines_view.close()] == [2, 4, 6]
    assert shown.getvalue().splitlines() == ["clorch: resumed", "step 4/6  loss 0.25", "step 6/6  loss 0.1667"]
