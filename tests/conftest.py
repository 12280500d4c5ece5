"""Shared test configuration: the `cuda` tier is skipped where CUDA is absent; `local_run`."""

from __future__ import annotations

import json
import os

import pytest
import torch

import clorch

# The suite reaches no network: MLflow 3 would otherwise fetch its telemetry settings from the
# internet in a thread of its own (and log the attempt) wherever no CI variable tells it not to.
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def local_run(tmp_path_factory):
    """`local_run(**kwargs)`: `clorch.run_local(**kwargs)`'s result in a run directory of its own,
    run once per distinct kwargs in the session. For the runs of clorch's own launcher that tests
    compare another launcher's run with (torchrun, two nodes): each such run costs a job launch."""
    done: dict[str, dict] = {}

    def run(**kwargs) -> dict:
        key = json.dumps(kwargs, sort_keys=True)
        if key not in done:
            done[key] = clorch.run_local(run_dir=tmp_path_factory.mktemp("local_run"), **kwargs)
        return done[key]

    return run
