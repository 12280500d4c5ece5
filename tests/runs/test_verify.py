"""`clorch-runs verify` over a real tiny exact run: identical when rerun, a changed data file named.

One run is made for the module (1 CPU rank, a 1-layer GPT over a small text file, 4 steps
with a checkpoint every 2); each verify reruns it (a few seconds).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from clorch.runs.cli import run_cli
from clorch.runs.environment import differences
from clorch.runs.verify import checkpoint_weights_sha256
from tests.clirunner import run_clorch_train

pytestmark = pytest.mark.timeout(60)

TINY = [
    "backend=gloo",
    "precision=fp32",
    "launcher.nproc_per_node=1",
    "exact=true",
    "max_steps=4",
    "data=text",
    "data.path=corpus.txt",
    "data.seq_len=16",
    "model=gpt",
    "model.n_layer=1",
    "model.d_model=16",
    "model.n_head=2",
    "batch_size=4",
    "checkpoint.policy=periodic",
    "checkpoint.every_n_steps=2",
]


def _write_corpus(path: Path, seed: int) -> None:
    rng = random.Random(seed)
    path.write_text("".join(rng.choice("abcdefgh \n") for _ in range(8000)))


@pytest.fixture(scope="module")
def exact_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("project")
    _write_corpus(cwd / "corpus.txt", seed=1)
    done = run_clorch_train([*TINY, "hydra.run.dir=run"], cwd, timeout=50)
    assert done.returncode == 0, done.stderr
    return cwd / "run"


def _verify(capsys, *args: str) -> tuple[int, str, str]:
    code = run_cli(["verify", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_checkpoints_weights_digest_is_the_summarys(exact_run):
    # --steps K compares checkpoints by the digest summary.json's weights_sha256 is made with.
    summary = json.loads((exact_run / "summary.json").read_text())
    assert checkpoint_weights_sha256(exact_run / "checkpoints" / "step_00000004.ckpt") == summary["weights_sha256"]
    env = json.loads((exact_run / "env.json").read_text())
    assert env["data_files"]["data.path"]["path"] == str(exact_run.parent / "corpus.txt")


def test_an_exact_run_rerun_is_identical(exact_run, capsys):
    code, out, err = _verify(capsys, str(exact_run))
    assert code == 0, out + err
    assert out.startswith("identical: at step 4") and "the run was exact=true" in out
    assert not list(exact_run.parent.glob("run/checkpoints/*.tmp"))  # nothing written beside the run


def test_a_changed_data_file_is_named(exact_run, capsys):
    corpus = exact_run.parent / "corpus.txt"
    kept = corpus.read_bytes()
    _write_corpus(corpus, seed=2)
    try:
        # At step 2: the rerun is stopped at its own step 2 checkpoint and compared with the run's.
        code, out, err = _verify(capsys, str(exact_run), "--steps", "2", "--json")
    finally:
        corpus.write_bytes(kept)
    assert code == 1, out + err
    verdict = json.loads(out)
    assert verdict["identical"] is False and verdict["step"] == 2 and verdict["exact"] is True
    # (clorch's commit may differ too, where the checkout gets a commit while the test runs)
    named = [d["what"] for d in verdict["differences"] if "data file" in d["what"]]
    assert named == [f"data.path {corpus} (data file changed)"]


def test_arguments_that_cannot_be_verified_exit_2_in_one_line(exact_run, tmp_path, capsys, monkeypatch):
    code, out, err = _verify(capsys, str(tmp_path))
    assert code == 2 and not out and len(err.strip().splitlines()) == 1
    assert f"RUN {str(tmp_path)!r}: no run has that directory" in err
    code, out, err = _verify(capsys, str(exact_run), "--steps", "3")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--steps 3" in err and "its checkpoints hold steps 2, 4" in err
    # A run that trusted modules: the rerun trusts only what the person verifying trusts.
    trusting = tmp_path / "trusting"
    shutil.copytree(exact_run, trusting, ignore=shutil.ignore_patterns("checkpoints"))
    config = trusting / "config.yaml"
    config.write_text("# trusted modules (CLORCH_TRUSTED_MODULES): my_project\n" + config.read_text())
    monkeypatch.delenv("CLORCH_TRUSTED_MODULES", raising=False)
    code, out, err = _verify(capsys, str(trusting))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "set CLORCH_TRUSTED_MODULES yourself" in err and "not trusted now: my_project" in err


def test_differences_name_versions_gpus_world_size_and_data_files():
    run = {
        "torch": "2.5.1",
        "gpus": ["NVIDIA H100"],
        "plan": {"world_size": 2},
        "data_files": {"data.path": {"path": "/d/a.txt", "sha256": "a" * 64, "bytes": 3}},
    }
    rerun = {
        "torch": "2.6.0",
        "gpus": ["NVIDIA H200"],
        "clorch": "0.1.0",
        "plan": {"world_size": 2},
        "data_files": {"data.path": {"path": "/d/a.txt", "sha256": "b" * 64, "bytes": 3}},
    }
    lines = [d.line() for d in differences(run, rerun)]
    assert lines == [
        "torch: 2.5.1 (run) -> 2.6.0 (rerun)",
        "GPU models: NVIDIA H100 (run) -> NVIDIA H200 (rerun)",
        "clorch version: not recorded (run) -> 0.1.0 (rerun)",
        f"data.path /d/a.txt (data file changed): sha256 {'a' * 16}..., 3 bytes (run)"
        f" -> sha256 {'b' * 16}..., 3 bytes (rerun)",
    ]


def test_the_rerun_of_a_run_without_checkpoints_gets_no_checkpoint_keys(exact_run, tmp_path):
    # checkpoint=none refuses checkpoint.dir as a key that does nothing: the rerun must not add it.
    from clorch.runs.records import Run
    from clorch.runs.rerun import rerun_args

    copy = tmp_path / "run"
    shutil.copytree(exact_run, copy, ignore=shutil.ignore_patterns("checkpoints"))
    config = (copy / "config.yaml").read_text().replace("policy: periodic", "policy: none")
    (copy / "config.yaml").write_text(config)
    args = rerun_args(Run(copy), tmp_path / "again")
    assert not [a for a in args if a.startswith(("checkpoint.dir=", "checkpoint.path="))], args
    assert "checkpoint.path=null" in rerun_args(Run(exact_run), tmp_path / "again")  # with checkpoints: its own
