"""clorch-train as the ranks of another launcher: torchrun (for real, 2 CPU ranks) and srun
(SLURM's variables set by hand on two real processes), plus the detection rules."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clorch.launch.external import detect
from clorch.runs.cli import run_cli
from tests.harness import free_port

pytestmark = pytest.mark.timeout(240)

TINY = ["+recipe=cpu_smoke", "data.sample_count=64", "log_every=1"]


def _clean_env() -> dict[str, str]:
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    return {
        k: v
        for k, v in os.environ.items()
        if k not in names and not k.startswith(("SLURM_", "TORCHELASTIC_", "CLORCH_"))
    }


def _torchrun(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--no-python",
        str(Path(sys.executable).parent / "clorch-train"),
        *args,
    ]
    return subprocess.run(command, cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=200)


def test_detection_rules():
    torchrun = {
        "TORCHELASTIC_RUN_ID": "job7",
        "RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "n1",
        "MASTER_PORT": "29500",
    }
    rank = detect(torchrun)
    assert (rank.launcher, rank.run_name, rank.env.rank, rank.env.local_world_size) == (
        "torchrun",
        "torchrun-job7",
        1,
        2,
    )
    slurm = {
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "SLURM_NNODES": "2",
        "SLURM_LOCALID": "1",
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_ID": "1234",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_NTASKS_PER_NODE": "2(x2)",
    }
    rank = detect(slurm)
    assert (rank.launcher, rank.run_name, rank.env.rank, rank.env.world_size) == ("slurm", "slurm-1234.0", 3, 4)
    assert (rank.env.master_addr, rank.env.local_world_size, rank.env.master_port) == ("gpu07", 2, 11234)
    assert detect({**slurm, "SUBMITIT_EXECUTOR": "slurm"}).launcher == "submitit"
    # One task per node: clorch's own launcher runs on each node.
    assert detect({**slurm, "SLURM_NTASKS": "2"}) is None
    assert detect({}) is None
    with pytest.raises(ValueError, match="SLURM_NTASKS"):
        detect({**slurm, "SLURM_NTASKS": "many"})


def test_torchrun_runs_the_recipe_as_its_ranks(tmp_path, local_run):
    proc = _torchrun([*TINY, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert summary["status"] == "succeeded" and summary["world_size"] == 2 and summary["launcher"] == "torchrun"
    assert env["launcher"] == "torchrun" and env["plan"]["world_size"] == 2
    assert not (tmp_path / "run" / "logs").exists()  # nothing spawned: torchrun's ranks trained
    # The same job through clorch's own launcher trains the same numbers (a run shared with
    # tests/launch/test_torchrun_nodes.py).
    own = local_run(recipe="cpu_smoke", sample_count=64, log_every=1, progress="off")
    assert own["summary"]["final"]["loss"] == pytest.approx(summary["final"]["loss"], rel=1e-6)


def test_a_config_error_under_torchrun_is_reported_once_per_node(tmp_path):
    proc = _torchrun([*TINY, "batch_size=0"], tmp_path)
    assert proc.returncode != 0
    assert proc.stderr.count("batch_size must be >= 1, got 0") == 1, proc.stderr
    assert not (tmp_path / "outputs").exists()


def _srun_env(task: int, port: int) -> dict[str, str]:
    """The environment srun gives task `task` of 2 on one node (job 4242, step 0)."""
    return {
        **_clean_env(),
        "SLURM_PROCID": str(task),
        "SLURM_LOCALID": str(task),
        "SLURM_NTASKS": "2",
        "SLURM_NNODES": "1",
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def test_srun_tasks_train_as_ranks(tmp_path):
    port = free_port()
    procs = []
    for task in range(2):
        env = _srun_env(task, port)
        procs.append(
            subprocess.Popen(
                [str(Path(sys.executable).parent / "clorch-train"), *TINY],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = [p.communicate(timeout=200) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    summary = json.loads((tmp_path / "outputs" / "slurm-4242.0" / "summary.json").read_text())
    assert summary["launcher"] == "slurm" and summary["world_size"] == 2 and summary["status"] == "succeeded"


def _torchrun_popen(entry: list[str], args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *entry, *args]
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def ended_early(tmp_path_factory) -> dict[str, tuple[Path, int, str]]:
    """{case: (its run directory, the exit status, the output)}, side by side: "failed" (under
    torchrun, rank 1 raises after step 2), "terminated" (SIGTERM to torchrun once the job has
    logged a step) and "srun_failed" (srun's two tasks, rank 1 raising after step 2)."""
    root = Path(__file__).resolve().parents[2]
    env = {**_clean_env(), "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    fail_env = {**env, "CLORCH_TESTS_FAIL_AT_STEP": "2", "CLORCH_TESTS_FAIL_RANK": "1"}
    dirs = {case: tmp_path_factory.mktemp(case) for case in ("failed", "terminated")}
    args = [*TINY, "data.sample_count=256", "epochs=1000"]
    failing = [str(root / "tests" / "launch" / "failing_rank.py")]
    clorch_train = ["--no-python", str(Path(sys.executable).parent / "clorch-train")]
    procs = {
        "failed": _torchrun_popen(
            failing, [*args, f"hydra.run.dir={dirs['failed'] / 'run'}"], dirs["failed"], fail_env
        ),
        "terminated": _torchrun_popen(
            clorch_train, [*args, f"hydra.run.dir={dirs['terminated'] / 'run'}"], dirs["terminated"], env
        ),
    }
    srun_dir, port = tmp_path_factory.mktemp("srun_failed"), free_port()
    tasks = [
        subprocess.Popen(
            [sys.executable, *failing, *args, f"hydra.run.dir={srun_dir / 'run'}"],
            cwd=srun_dir,
            env={**fail_env, **_srun_env(task, port), "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for task in range(2)
    ]
    metrics, deadline = dirs["terminated"] / "run" / "metrics.jsonl", time.monotonic() + 150
    while not (metrics.exists() and metrics.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)  # until the first step's record
    procs["terminated"].send_signal(signal.SIGTERM)
    outs = {case: proc.communicate(timeout=180)[0] for case, proc in procs.items()}
    ended = {case: (dirs[case] / "run", procs[case].returncode, outs[case]) for case in procs}
    task_outs = [task.communicate(timeout=180)[0] for task in tasks]
    ended["srun_failed"] = (srun_dir / "run", max(t.returncode for t in tasks), "".join(task_outs))
    return ended


def _show(run_dir: Path, capsys) -> str:
    capsys.readouterr()
    assert run_cli(["show", str(run_dir)]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("case", ["failed", "srun_failed"])
def test_a_rank_failing_under_torchrun_or_srun_leaves_the_summary_of_a_failed_job(ended_early, capsys, case):
    run_dir, code, out = ended_early[case]
    assert code != 0, out[-3000:]
    assert "clorch-train: job failed: rank 1 failed first: RuntimeError: failing on purpose after step 2" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    launcher = "torchrun" if case == "failed" else "slurm"
    assert summary["status"] == "failed" and summary["failed_rank"] == 1 and summary["launcher"] == launcher
    assert summary["error"]["message"] == "failing on purpose after step 2"
    assert "status     failed" in _show(run_dir, capsys)


def test_torchrun_terminated_leaves_the_summary_of_an_interrupted_job(ended_early, capsys):
    run_dir, code, out = ended_early["terminated"]
    assert code != 0, out[-3000:]
    assert "clorch-train: interrupted by SIGTERM after step" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["interrupted_by"] == "SIGTERM"
    assert 0 < summary["steps"] < summary["planned_steps"]
    assert "status     interrupted" in _show(run_dir, capsys)
