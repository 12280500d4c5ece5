"""Every command clorch prints works pasted in another directory.

The resume hint (each node's own run directory), `clorch-runs show`'s re-run and a
sweep's commands carry absolute paths, the trust variable the run was started with
and the run directory. The end-to-end test runs each printed command with a shell
from another directory: a run of your own loss (a module in the working
directory, trusted by the variable) from a recipe given by a relative path is
interrupted, resumed by its hint in place, and re-run by `clorch-runs show`'s
command with `loss=cross_entropy` added, which `clorch-runs diff` then shows.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from clorch.config import compose
from clorch.config.checks import checked
from clorch.engine.interrupts import resume_hint
from clorch.runs.commands import rerun_command
from clorch.runs.records import Run
from tests.clirunner import run_clorch_train, start_clorch_train

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]
BIN = str(Path(sys.executable).parent)
RECIPE = """# @package _global_
defaults:
  - override /backend: gloo
  - override /precision: fp32
data:
  _target_: clorch.data.datasets.Blobs
loss:
  _target_: mymod.xent
  smoothing: 0.1
launcher:
  nproc_per_node: 2
batch_size: 16
"""
LOSS = """import torch.nn.functional as F


def xent(output, target, smoothing=0.0):
    return F.cross_entropy(output, target, label_smoothing=smoothing)
"""


def _config(*args: str):
    typed, errors = checked(compose(["+recipe=cpu_smoke", "checkpoint=periodic", *args]))
    assert not errors, errors
    return typed


def _with_checkpoint(directory: Path, step: int = 5) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"step_{step:08d}.ckpt").write_bytes(b"")  # the hint reads names only


def _command(hint: str) -> list[str]:
    return shlex.split(hint.split("resume with: ", 1)[1])


def test_the_resume_hint_names_the_run_directory_absolute_paths_and_the_trust_variable(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CLORCH_TRUSTED_MODULES", "mymod")
    run_dir = tmp_path / "outputs" / "run"
    _with_checkpoint(run_dir / "checkpoints")
    argv = [
        "+recipe=./r.yaml",
        "model.init_from=w.safetensors",
        "data.path=../d.txt",
        "hydra.run.dir=outputs/run",
        "checkpoint.dir=old",
        "checkpoint.resume=none",
    ]
    command = _command(resume_hint(_config(), Path("outputs/run"), argv))
    assert command[:3] == ["cd", str(tmp_path), "&&"] and command[3] == "CLORCH_TRUSTED_MODULES=mymod"
    assert command[4] == "clorch-train"
    assert command[5:8] == [
        f"+recipe={tmp_path / 'r.yaml'}",
        f"model.init_from={tmp_path / 'w.safetensors'}",
        f"data.path={tmp_path.parent / 'd.txt'}",
    ]
    assert command[8:] == [
        f"hydra.run.dir={run_dir}",
        f"checkpoint.dir={run_dir / 'checkpoints'}",
        "checkpoint.resume=latest",
    ]


def test_without_the_trust_variable_the_hint_is_the_command_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CLORCH_TRUSTED_MODULES", raising=False)
    _with_checkpoint(tmp_path / "run" / "checkpoints")
    command = _command(resume_hint(_config(), tmp_path / "run", ["+recipe=cpu_smoke"]))
    assert command[0] == "clorch-train" and f"hydra.run.dir={tmp_path / 'run'}" in command


def test_each_node_of_a_multi_node_run_resumes_in_its_own_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["+recipe=cpu_smoke", "launcher.nnodes=2"]
    hints = []
    for node in (0, 1):
        run_dir = tmp_path / f"node{node}"
        _with_checkpoint(run_dir / "checkpoints", step=10)
        hints.append(
            _command(
                resume_hint(
                    _config("launcher.nnodes=2", f"launcher.node_rank={node}"),
                    run_dir,
                    [*argv, f"launcher.node_rank={node}"],
                )
            )
        )
    for node, command in enumerate(hints):
        assert f"hydra.run.dir={tmp_path / f'node{node}'}" in command
        assert f"checkpoint.dir={tmp_path / f'node{node}' / 'checkpoints'}" in command
        assert f"launcher.node_rank={node}" in command


def test_a_sweep_jobs_hint_resumes_that_job_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("# @package _global_\nepochs: 2\n")
    from clorch.config.composer import rewrite_recipe_overrides

    rewritten = rewrite_recipe_overrides([f"+recipe={recipe}"])  # as clorch-train hands it to Hydra
    job = tmp_path / "multirun" / "1"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([*rewritten, "seed=2"]))
    _with_checkpoint(job / "checkpoints")
    command = _command(resume_hint(_config(), job, ["-m", "+recipe=./mine.yaml", "seed=1,2"]))
    assert "-m" not in command and "seed=2" in command and "seed=1,2" not in command
    assert f"+recipe={recipe}" in command and f"hydra.run.dir={job}" in command


def test_the_rerun_command_carries_the_trust_variable_and_absolute_paths(tmp_path):
    run_dir = tmp_path / "outputs" / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("# trusted modules (CLORCH_TRUSTED_MODULES): mymod, other.pkg\nepochs: 1\n")
    (run_dir / "env.json").write_text(json.dumps({"cwd": str(tmp_path / "project")}))
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["+recipe=./r.yaml", "model.init_from=w.bin"]))
    command = shlex.split(rerun_command(Run(run_dir)))
    assert command[:4] == ["cd", str(tmp_path / "project"), "&&", "CLORCH_TRUSTED_MODULES=mymod,other.pkg"]
    assert command[4:] == [
        "clorch-train",
        f"+recipe={tmp_path / 'project' / 'r.yaml'}",
        f"model.init_from={tmp_path / 'project' / 'w.bin'}",
    ]


def test_a_sweep_takes_targets_on_its_command_line_and_an_env_interpolation(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "EPOCHS_FROM_ENV": "2"}
    targets = [
        "model._target_=torch.nn.Linear",
        "model.in_features=8",
        "model.out_features=4",
        "data._target_=clorch.data.datasets.Blobs",
        "data.features=8",
        "data.classes=4",
        "data.sample_count=64",
        "loss=cross_entropy",
        "epochs=${oc.env:EPOCHS_FROM_ENV,3}",
    ]
    printed = run_clorch_train(
        ["+recipe=cpu_smoke", *targets, "--cfg", "job", "--resolve"], tmp_path, env=env, timeout=120
    )
    assert printed.returncode == 0, printed.stderr
    config = yaml.safe_load(printed.stdout)
    assert config["model"]["_target_"] == "torch.nn.Linear" and config["epochs"] == 2
    assert config["data"]["_target_"] == "clorch.data.datasets.Blobs" and "in_features" not in config["data"]
    done = run_clorch_train(
        ["-m", "+recipe=cpu_smoke", *targets, "preflight=false", "hydra.sweep.dir=sweep"],
        tmp_path,
        env=env,
        timeout=200,
    )
    assert done.returncode == 0, done.stderr
    assert "unrecognized arguments" not in done.stderr
    summary = json.loads((tmp_path / "sweep" / "0" / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["steps"] == 2 * 2  # 64 samples / 16 / 2 ranks, 2 epochs


def _shell(command: str, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_printed_commands_work_from_another_directory(tmp_path):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "mymod").mkdir(parents=True)
    elsewhere.mkdir()
    (project / "mymod" / "__init__.py").write_text(LOSS)
    (project / "r.yaml").write_text(RECIPE)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "CLORCH_TRUSTED_MODULES": "mymod",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    run_dir = project / "outputs" / "first"
    proc = start_clorch_train(
        [
            "+recipe=./r.yaml",
            "epochs=25",
            "checkpoint=periodic",
            "checkpoint.every_n_steps=5",
            "hydra.run.dir=outputs/first",
        ],
        project,
        env=env,
    )
    deadline = time.monotonic() + 150
    while not list((run_dir / "checkpoints").glob("step_*.ckpt")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no checkpoint within 150 s"
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    hint = stderr.split("resume with: ", 1)[1].splitlines()[0]
    assert hint.startswith(f"cd {project} && CLORCH_TRUSTED_MODULES=mymod clorch-train +recipe={project / 'r.yaml'}")

    # The hint, pasted elsewhere without the variable set: the run goes on in its own directory.
    bare = {k: v for k, v in env.items() if k != "CLORCH_TRUSTED_MODULES"}
    resumed = _shell(hint, elsewhere, bare, timeout=200)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["steps"] == summary["planned_steps"] == 25 * 15  # 15 a epoch
    assert summary["resumed_from"].startswith(str(run_dir / "checkpoints" / "step_"))
    assert list(elsewhere.iterdir()) == [] and [p.name for p in (project / "outputs").iterdir()] == ["first"]

    # clorch-runs show's re-run, pasted elsewhere, with the loss chosen on the command line.
    command = rerun_command(Run(run_dir))
    assert command.startswith(f"cd {project} && CLORCH_TRUSTED_MODULES=mymod clorch-train "), command
    # One epoch of the 25 is enough to see it run (CI's budget); diff then shows epochs too.
    again = _shell(f"{command} hydra.run.dir=outputs/again loss=cross_entropy epochs=1", elsewhere, bare, timeout=200)
    assert again.returncode == 0, again.stderr
    second = project / "outputs" / "again"
    assert json.loads((second / "summary.json").read_text())["status"] == "succeeded"

    # The command line's loss replaced the recipe's, and diff says so.
    diff = subprocess.run(
        [sys.executable, "-c", "from clorch.runs.cli import main; main()", "diff", "--json", str(run_dir), str(second)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert diff.returncode == 0, diff.stderr
    config = json.loads(diff.stdout)["config"]
    assert config["loss._target_"] == ["mymod.xent", None] and config["loss.smoothing"] == [0.1, None]
    assert config["loss.name"][1] == "cross_entropy" and config["epochs"] == [25, 1]
