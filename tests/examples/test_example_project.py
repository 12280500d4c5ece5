"""The example project (examples/my_project): its own model, dataset and loss trained by clorch-train
on 2 gloo ranks, as a 2-value sweep, and resumed mid-run from a checkpoint to the same weights."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.clirunner import run_clorch_train

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "my_project"
# Small and quick; one DataLoader worker per rank, so the resume below goes through workers.
SHORT = [
    "epochs=2",
    "data.sample_count=512",
    "batch_size=32",
    "data.num_workers=1",
    "checkpoint=periodic",
    "checkpoint.every_n_steps=4",
]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("example")
    shutil.copytree(EXAMPLE, root / "my_project_root", ignore=shutil.ignore_patterns("outputs", "multirun"))
    return root / "my_project_root"


def _env(trusted: bool = True) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CLORCH_TRUSTED_MODULES"}
    if trusted:
        env["CLORCH_TRUSTED_MODULES"] = "my_project"
    return env


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.timeout(240)
def test_the_example_sweeps_and_resumes_to_the_same_weights(project):
    refused = run_clorch_train(["+recipe=./spirals.yaml", *SHORT], project, _env(trusted=False), timeout=120)
    assert refused.returncode == 2, refused.stderr
    assert "CLORCH_TRUSTED_MODULES=my_project clorch-train" in refused.stderr

    sweep = run_clorch_train(
        ["-m", "+recipe=./spirals.yaml", *SHORT, "optim.lr=0.01,0.003"], project, _env(), timeout=200
    )
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    (sweep_dir,) = (project / "multirun").glob("*/*")
    jobs = [_summary(sweep_dir / str(i)) for i in (0, 1)]
    assert [j["status"] for j in jobs] == ["succeeded", "succeeded"]
    assert jobs[0]["weights_sha256"] != jobs[1]["weights_sha256"]  # the learning rates differ
    first = jobs[0]
    assert first["steps"] == 16 and first["final"]["eval_loss"] < 0.7  # focal loss: below chance

    # Resume job 0 from its step-8 checkpoint, mid-epoch, in a new run directory: same end, bit for bit.
    checkpoint = sweep_dir / "0" / "checkpoints" / "step_00000008.ckpt"
    if not checkpoint.exists():  # kept only the last two: resume from the older one
        checkpoint = sorted((sweep_dir / "0" / "checkpoints").glob("step_*.ckpt"))[0]
    resumed = run_clorch_train(
        ["+recipe=./spirals.yaml", *SHORT, "optim.lr=0.01", f"checkpoint.resume={checkpoint}", "hydra.run.dir=resumed"],
        project,
        _env(),
        timeout=120,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    again = _summary(project / "resumed")
    assert again["resumed_from"] == str(checkpoint)
    assert again["weights_sha256"] == first["weights_sha256"]
    assert again["final"]["eval_loss"] == first["final"]["eval_loss"]
