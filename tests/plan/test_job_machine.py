"""The hardware a job needs is checked where it runs (clorch.plan.where): a sweep submitted to SLURM
nodes from a login node without GPUs is planned for the GPUs it asks for there, its ranks check
their own node, and `--cfg job` prints a config whatever this machine lacks; config errors are
still reported before anything is submitted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clorch.config.overrides import compose_once
from clorch.plan.machine import installed
from clorch.plan.plan import config_errors, plan_or_errors
from clorch.plan.where import Machine, job_machine

pytestmark = pytest.mark.timeout(120)
SLURM = ["hydra/launcher=submitit_slurm"]
DDP = ["+recipe=ddp_bf16", "max_steps=2"]


@pytest.fixture
def login_node(tmp_path, monkeypatch) -> dict[str, str]:
    """This machine as a SLURM login node without GPUs: sbatch and srun on PATH, no CUDA device."""
    for command in ("sbatch", "srun"):
        (tmp_path / command).write_text("#!/bin/sh\nexit 1\n")
        (tmp_path / command).chmod(0o755)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    return {"PATH": f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}"}


def _plan(overrides: list[str], machine: Machine | None = None):
    cfg, errors = compose_once(overrides)
    assert cfg is not None and errors == [], errors
    return plan_or_errors(cfg, machine=machine)


def test_nccl_on_the_gpus_slurm_nodes_are_asked_for_is_planned_for_them(login_node):
    machine = job_machine([*SLURM, "hydra.launcher.gpus_per_node=8", "hydra.launcher.nodes=2"], login_node)
    assert not machine.hardware_here and machine.gpus == tuple("01234567") and machine.problems == ()
    for backend in ("nccl", "auto"):  # auto: the nodes' GPUs, not this machine's CPU
        plan, errors = _plan([*DDP, f"backend={backend}"], machine)
        assert errors == []
        assert (plan.backend, plan.nproc_per_node, plan.devices, plan.world_size) == ("nccl", 8, list(range(8)), 16)
    # The same config planned for this machine (as each rank does on its node) is refused here.
    _, errors = _plan([*DDP, "backend=nccl"])
    assert errors == [
        "backend=nccl: backend 'nccl' needs CUDA GPUs, but none is visible on this machine: "
        "use backend='gloo' or 'auto' for CPU ranks"
    ]


def test_fp8_leaves_the_nodes_compute_capability_to_their_ranks(login_node):
    machine = job_machine([*SLURM, "hydra.launcher.gpus_per_node=8"], login_node)
    _, errors = _plan([*DDP, "backend=nccl", "precision=fp8"], machine)
    assert not any("needs CUDA GPUs" in e or "compute capability" in e for e in errors), errors
    # the package is this machine's: submitit's jobs run this Python
    assert [e for e in errors if "torchao" in e] == ([] if installed("torchao") else errors) and len(errors) <= 1


def test_nodes_asked_for_no_gpu_run_cpu_ranks_and_refuse_nccl_naming_the_key(login_node):
    machine = job_machine(SLURM, login_node)
    plan, errors = _plan([*DDP, "backend=auto", "launcher.nproc_per_node=2"], machine)
    assert errors == [] and (plan.backend, plan.devices) == ("gloo", None)
    _, errors = _plan([*DDP, "backend=nccl"], machine)
    assert errors == [
        "backend=nccl: backend 'nccl' needs CUDA GPUs, but none is visible on each node "
        "hydra/launcher=submitit_slurm asks for (hydra.launcher.gpus_per_node is not set: set it to ask "
        "for GPUs): use backend='gloo' or 'auto' for CPU ranks"
    ]


def test_tasks_are_the_ranks_each_on_a_gpu_of_its_own(login_node):
    tasks = [*SLURM, "hydra.launcher.tasks_per_node=4"]
    plan, errors = _plan([*DDP, "backend=auto"], job_machine([*tasks, "hydra.launcher.gpus_per_task=1"], login_node))
    assert errors == [] and (plan.backend, plan.nproc_per_node, plan.devices) == ("nccl", 4, [0, 1, 2, 3])
    plan, errors = _plan([*DDP, "backend=nccl"], job_machine([*tasks, "hydra.launcher.gres=gpu:a100:4"], login_node))
    assert errors == [] and plan.world_size == 4
    _, errors = _plan([*DDP, "backend=nccl"], job_machine([*tasks, "hydra.launcher.gpus_per_node=2"], login_node))
    assert errors == [
        "backend=nccl: hydra.launcher.tasks_per_node=4 starts 4 ranks a node, each on a GPU of its own "
        "under nccl, but each node hydra/launcher=submitit_slurm asks for (hydra.launcher.gpus_per_node=2) "
        "has 2: ask for 4 GPUs a node, or use backend=gloo for CPU ranks"
    ]


def test_without_slurm_commands_a_slurm_sweep_is_one_line_before_anything_is_submitted(tmp_path):
    machine = job_machine([*SLURM, "hydra.launcher.gpus_per_node=8"], {"PATH": str(tmp_path)})
    _, errors = _plan([*DDP, "optim.lr=-1"], machine)
    assert errors == [
        "optim.lr must be > 0, got -1",
        "hydra/launcher=submitit_slurm submits through SLURM's sbatch and srun, but sbatch and srun are not "
        "on this machine's PATH: run clorch-train on a SLURM login node (or load SLURM's module), or use "
        "hydra/launcher=submitit_local",
    ]


def test_submitit_local_runs_here_on_the_gpus_it_asks_for(login_node):
    machine = job_machine(["hydra/launcher=submitit_local", "hydra.launcher.gpus_per_node=1"], login_node)
    assert machine.hardware_here and machine.problems == (
        "hydra.launcher.gpus_per_node=1 asks for 1 GPU(s), but this machine shows 0 and "
        "hydra/launcher=submitit_local runs its jobs here: ask for fewer",
    )
    assert job_machine(["hydra/launcher=basic"], login_node) == Machine.here()


def test_cfg_job_prints_a_config_this_machine_cannot_run(login_node):
    unwritable = ["checkpoint=final", "checkpoint.dir=/proc/x"]
    for overrides in (["backend=nccl"], ["precision=fp8"], ["launcher.devices=[0,3]"], unwritable):
        cfg, _ = compose_once([*DDP, *overrides])
        assert config_errors(cfg) == [], overrides
    # what the config contradicts itself in is still an error
    cfg, _ = compose_once([*DDP, "precision=fp8", "backend=gloo"])
    (error,) = config_errors(cfg)
    assert error.startswith("precision=fp8 needs CUDA GPUs") and "CPU ranks over gloo" in error
    assert not Path("outputs").exists()
