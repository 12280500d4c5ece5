"""A job from start to end: environment, results, logs, the record, stop, no orphans on success."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import clorch.distributed as cd
from clorch.launch import Job, await_job, job_logs, job_status, launch, stop_job
from tests.launch.procutil import all_pids, assert_gone, wait_for_pid_files

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]


def test_success_env_results_logs_and_record(tmp_path):
    job = cd.launch(
        "tests.launch.workers:report",
        nproc_per_node=3,
        backend=None,
        args={"lr": 0.5},
        log_dir=tmp_path,
        env={"CLORCH_TEST_MARK": "m"},
    )
    status = await_job(job, timeout=30)
    assert status["state"] == "succeeded"
    assert status["exit_codes"] == [0, 0, 0] and status["signals"] == [None] * 3
    assert status["failed_rank"] is None and status["error"] is None
    for rank, result in enumerate(status["results"]):
        assert result["ctx"] == {
            "rank": rank,
            "local_rank": rank,
            "world_size": 3,
            "backend": None,
            "args": {"lr": 0.5},
        }
        env = result["env"]
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == (
            str(rank),
            str(rank),
            "3",
            "3",
        )
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) == status["master_port"]
        assert env["CLORCH_RESTART_COUNT"] == "0" and env["PYTHONUNBUFFERED"] == "1"
        assert env["NCCL_NVLS_ENABLE"] == "0" and env["NVSHMEM_DISABLE_NVLS"] == "1"
        assert env["TORCH_CPP_LOG_LEVEL"] == os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR")
        assert env["CLORCH_TEST_MARK"] == "m" and env["CUDA_VISIBLE_DEVICES"] == os.environ.get("CUDA_VISIBLE_DEVICES")
        assert env["OMP_NUM_THREADS"] == os.environ.get("OMP_NUM_THREADS", "1")
        assert env["CLORCH_STORE_FD"] is None, "a rank without a clorch group gives the store's socket back"
        assert result["torch_imported"] is False, "backend=None ranks never import torch"
        logs = job_logs(job, rank)
        assert logs["stdout"] == f"stdout of rank {rank}\n"
        assert f"stderr of rank {rank}\n" in logs["stderr"]
    record = json.loads((tmp_path / "job.json").read_text())
    assert record["config"]["main"] == "tests.launch.workers:report"
    assert record["config"]["args"] == {"lr": 0.5}
    assert record["status"]["pids"] == job.pids and len(job.pids) == 3
    assert record["command"][:3] == [sys.executable, "-m", "clorch.launch.child"]
    assert json.loads((tmp_path / "args.json").read_text()) == {"lr": 0.5}
    assert job_status(job) == status


def test_no_one_can_take_the_port_between_the_launchers_choice_and_rank_0s_store(tmp_path):
    release = tmp_path / "release"
    job = cd.launch(
        "tests.launch.workers:wait_for_release",
        nproc_per_node=2,
        backend="gloo",
        args={"release": str(release)},
        log_dir=tmp_path / "run",
    )
    deadline = time.monotonic() + 30
    while job_status(job)["master_port"] is None:
        assert time.monotonic() < deadline, "the job did not start its ranks within 30 s"
        time.sleep(0.01)
    # Rank 0 is most likely still importing torch: its store has not started yet.
    with socket.socket() as thief, pytest.raises(OSError) as taken:
        thief.bind(("127.0.0.1", job_status(job)["master_port"]))
    assert taken.value.errno == errno.EADDRINUSE
    release.touch()
    assert await_job(job, timeout=60)["state"] == "succeeded"


def test_a_rank_without_a_backend_can_make_its_group_with_torch(tmp_path):
    job = cd.launch("tests.launch.workers:torch_group", nproc_per_node=2, backend=None, log_dir=tmp_path)
    status = await_job(job, timeout=60)
    assert status["state"] == "succeeded", status["error"]
    assert status["results"] == [1.0, 1.0]


def test_rank_0_makes_a_second_group_on_the_port_after_starting_a_program(tmp_path):
    """The handed-over socket is rank 0's alone: a program it starts does not keep the port,
    and the port can be bound again while the first store's connections still linger."""
    job = cd.launch("tests.launch.workers:gloo_group_again", nproc_per_node=2, backend="gloo", log_dir=tmp_path)
    status = await_job(job, timeout=90)
    assert status["state"] == "succeeded", status["error"]
    assert status["results"] == [2.0, 2.0]


def test_each_restart_gets_a_port_of_its_own(tmp_path):
    job = cd.launch(
        "tests.launch.workers:flaky",
        nproc_per_node=2,
        backend=None,
        args={"succeed_at": 1},
        max_restarts=1,
        log_dir=tmp_path,
    )
    status = await_job(job, timeout=60)
    assert status["state"] == "succeeded", status["error"]
    ports = [attempt["master_port"] for attempt in status["attempts"]]
    assert len(ports) == 2 and ports[0] != ports[1], ports


def test_user_omp_num_threads_is_kept_and_one_rank_gets_none(tmp_path):
    job = launch(
        "tests.launch.workers:report",
        nproc_per_node=2,
        backend=None,
        log_dir=tmp_path / "a",
        env={"OMP_NUM_THREADS": "3"},
    )
    single = launch(
        "tests.launch.workers:report",
        nproc_per_node=1,
        backend=None,
        log_dir=tmp_path / "b",
        env={"OMP_NUM_THREADS": ""},
    )
    odd = launch("tests.launch.workers:returns_a_set", nproc_per_node=1, backend=None, log_dir=tmp_path / "c")
    assert [r["env"]["OMP_NUM_THREADS"] for r in job.wait(30)["results"]] == ["3", "3"]
    assert single.wait(30)["results"][0]["env"]["OMP_NUM_THREADS"] == ""
    odd_status = odd.wait(30)
    assert odd_status["state"] == "succeeded" and odd_status["results"] == [None]
    assert "main returned a value that is not JSON-serializable (set" in odd.logs(0)["stderr"]


def test_default_log_dir_is_fresh():
    first = launch("tests.launch.workers:report", nproc_per_node=1, backend=None)
    second = launch("tests.launch.workers:report", nproc_per_node=1, backend=None)
    try:
        assert first.log_dir != second.log_dir
        assert first.log_dir.parent == Path(tempfile.gettempdir())
        assert first.wait(30)["state"] == second.wait(30)["state"] == "succeeded"
        assert (first.log_dir / "rank_0.stdout").read_text() == "stdout of rank 0\n"
    finally:
        shutil.rmtree(first.log_dir)
        shutil.rmtree(second.log_dir)


def test_no_orphans_after_success(tmp_path):
    job = launch(
        "tests.launch.workers:grandchild_then",
        backend=None,
        log_dir=tmp_path / "logs",
        args={"pid_dir": str(tmp_path), "then": "return"},
    )
    assert job.wait(30)["state"] == "succeeded"
    assert_gone(all_pids(wait_for_pid_files(tmp_path, [0, 1])))


def test_stop_and_open_from_another_process(tmp_path):
    with launch(
        "tests.launch.workers:grandchild_then",
        backend=None,
        log_dir=tmp_path / "logs",
        args={"pid_dir": str(tmp_path), "then": "sleep"},
        grace_period=2,
    ) as job:
        pids = all_pids(wait_for_pid_files(tmp_path, [0, 1]))
        assert job_status(job)["state"] == "running"
        with pytest.raises(TimeoutError, match="still running after timeout=0.1s"):
            await_job(job, timeout=0.1)
        opened = subprocess.run(
            [
                sys.executable,
                "-c",
                "import json, sys; from clorch.launch import Job; "
                "job = Job.open(sys.argv[1]); print(json.dumps([job.status()['state'], job.pids]))",
                str(job.log_dir),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert json.loads(opened.stdout) == ["running", job.pids], opened.stderr
        status = stop_job(job, timeout=20)
    assert status["state"] == "stopped"
    assert status["signals"] == ["SIGTERM", "SIGTERM"]
    assert_gone(pids)
    assert Job.open(job.log_dir).status()["state"] == "stopped"


def test_stop_from_an_observer(tmp_path):
    job = launch(
        "tests.launch.workers:grandchild_then",
        backend=None,
        log_dir=tmp_path / "logs",
        args={"pid_dir": str(tmp_path), "then": "sleep"},
        grace_period=2,
    )
    with job:
        pids = all_pids(wait_for_pid_files(tmp_path, [0, 1]))
        observer = Job.open(tmp_path / "logs")
        assert observer.stop(timeout=20)["state"] == "stopped"
        assert job.wait(5)["state"] == "stopped"
    assert_gone(pids)
    with pytest.raises(ValueError, match="rank must be one of this node's ranks \\[0, 1\\], got 7"):
        job_logs(job, 7)
    with pytest.raises(ValueError, match="holds no job record"):
        Job.open(tmp_path)
