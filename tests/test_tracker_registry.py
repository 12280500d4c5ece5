"""A tracker is one module of clorch.trackers: it declares itself and registers, and the names,
the extras check, the builder and the folders clorch-runs skips all come from the registry.

The worked example writes a new tracker module, echo_tracker.py, as a file of the package
(a temporary folder joined to the package's __path__, which is how Python finds a module
dropped into clorch/trackers/) with a client package of its own, then builds and runs it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from clorch import trackers
from clorch.runs import discover
from clorch.trackers import BaseTracker, Extra, base, build_trackers, missing_extras, register, tracker_folders

pytestmark = pytest.mark.timeout(30)
ROOT = Path(__file__).resolve().parents[1]

# clorch/trackers/echo_tracker.py: the whole of a new tracker.
ECHO_TRACKER = '''
"""The echo tracker: a run's config and metrics as JSON lines in RUN_DIR/echo/ (an example)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from clorch.trackers.base import BaseTracker, Extra, record_metrics, register


@register
class EchoTracker(BaseTracker):
    name = "echo"
    extra = Extra("clorch_echo_client", "clorch-echo-client", clorch_extra=False)
    folders = ("echo",)
    logger_keys = ("experiment",)

    def __init__(self, directory: Path, experiment: str | None, run_name: str):
        super().__init__()
        self.directory, self.experiment, self.run_name = directory, experiment, run_name
        self.client: Any = None

    @classmethod
    def from_settings(cls, run_dir: Path, run_name: str, settings: Mapping[str, Any]) -> EchoTracker:
        return cls(Path(run_dir) / "echo", settings["experiment"], run_name)

    def _start(self, params: dict[str, Any]) -> None:
        import clorch_echo_client  # lazy: the tracker's package is an optional extra

        self.client = clorch_echo_client.Run(self.directory, self.experiment, self.run_name, params)

    def _log(self, record: dict[str, Any]) -> None:
        self.client.write(*record_metrics(record))

    def _finish(self, status: str, artifacts: list[Path]) -> None:
        self.client.close(status, [path.name for path in artifacts])
'''

# The tracker's own package (what `pip install clorch-echo-client` would bring).
ECHO_CLIENT = '''
import json


class Run:
    def __init__(self, directory, experiment, name, params):
        directory.mkdir(parents=True, exist_ok=True)
        self.file = open(directory / "run.jsonl", "w")
        self._put(experiment=experiment, name=name, params=params)

    def _put(self, **line):
        self.file.write(json.dumps(line) + "\\n")

    def write(self, step, numbers):
        self._put(step=step, metrics=numbers)

    def close(self, status, files):
        self._put(status=status, files=files)
        self.file.close()
'''


@pytest.fixture
def echo_files(tmp_path, monkeypatch):
    """echo_tracker.py in a folder joined to clorch.trackers' __path__, its client in `client/`
    (not importable until a test puts it on sys.path); the registry and sys.modules restored after."""
    package = tmp_path / "package"
    package.mkdir()
    (package / "echo_tracker.py").write_text(textwrap.dedent(ECHO_TRACKER))
    client = tmp_path / "client"
    client.mkdir()
    (client / "clorch_echo_client.py").write_text(textwrap.dedent(ECHO_CLIENT))
    monkeypatch.setattr(trackers, "__path__", [*trackers.__path__, str(package)])
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    yield client
    for name in ("clorch.trackers.echo_tracker", "clorch_echo_client"):
        sys.modules.pop(name, None)
    trackers.__dict__.pop("echo_tracker", None)  # the attribute an import of a submodule sets


def test_a_new_tracker_module_is_found_built_and_checked(tmp_path, monkeypatch, echo_files):
    assert trackers.discover() == ("echo", "mlflow", "wandb")  # what importing the package runs
    assert {"echo", "mlartifacts", "mlruns", "wandb"} <= tracker_folders()

    # Its extra is checked like the shipped trackers', without importing it.
    assert missing_extras(["echo", "mlflow"])[:1] == [
        "tracker echo needs the clorch-echo-client package: pip install clorch-echo-client"
    ]
    monkeypatch.syspath_prepend(str(echo_files))
    assert missing_extras(["echo"]) == []

    # Built from the logger section, beside a shipped tracker, in the order named; it reads its own key.
    run_dir = tmp_path / "outputs" / "2026-12-04" / "10-00-00"
    settings = {"trackers": ["echo", "mlflow"], "experiment": "exp", "tracking_uri": None, "mode": "offline"}
    echo, mlflow = build_trackers(["echo", "mlflow"], run_dir, run_name="2026-12-04/10-00-00", settings=settings)
    assert (type(echo).__name__, type(mlflow).__name__) == ("EchoTracker", "MLflowTracker")
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text("{}")
    echo.start({"seed": 7})
    echo.log({"kind": "train", "step": 10, "loss": 0.5})
    echo.finish("succeeded", [run_dir / "summary.json", run_dir / "loss.png"])
    lines = [json.loads(line) for line in (run_dir / "echo" / "run.jsonl").read_text().splitlines()]
    assert lines == [
        {"experiment": "exp", "name": "2026-12-04/10-00-00", "params": {"seed": 7}},
        {"step": 10, "metrics": {"train/loss": 0.5}},
        {"status": "succeeded", "files": ["summary.json"]},
    ]
    with pytest.raises(ValueError, match=r"tracker echo reads logger\.experiment: missing from the settings"):
        build_trackers(["echo"], run_dir, run_name="r", settings={"tracking_uri": None})
    with pytest.raises(ValueError, match="unknown tracker 'comet'; allowed: echo, mlflow, wandb"):
        build_trackers(["comet"], run_dir, run_name="r", settings=settings)


def test_register_refuses_a_tracker_that_does_not_declare_itself(monkeypatch):
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))

    class NoExtra(BaseTracker):
        name = "noextra"

    with pytest.raises(TypeError, match=r"NoExtra: `extra` must be an Extra\(module, dist\), got None"):
        register(NoExtra)

    class Taken(BaseTracker):
        name = "mlflow"
        extra = Extra("mlflow", "mlflow-skinny")

        @classmethod
        def from_settings(cls, run_dir, run_name, settings):
            return cls()

    with pytest.raises(ValueError, match="tracker name 'mlflow' of .*Taken is taken by .*MLflowTracker"):
        register(Taken)
    assert base.registered()["mlflow"] is trackers.MLflowTracker


def test_the_shipped_trackers_are_registered_and_their_libraries_not_imported():
    # A fresh interpreter: importing the package (as every command line does, through the
    # config's checks) imports no tracker library.
    code = "import sys, clorch.trackers as t; print(t.TRACKERS, [m for m in ('mlflow', 'wandb') if m in sys.modules])"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=20, check=True
    )
    assert done.stdout.split("\n")[0] == "('mlflow', 'wandb') []"
    assert {"mlartifacts", "mlruns", "wandb"} <= discover._SKIPPED  # clorch-runs skips their stores
