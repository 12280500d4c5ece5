"""clorch-train -m hydra/launcher=submitit_slurm from a machine without SLURM's commands: one line,
exit 2, nothing submitted (submitit's own traceback otherwise). From a login node without GPUs,
the sweep is checked for the GPUs it asks for on the nodes, not for this machine's."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.clirunner import run_clorch_train

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs the slurm extra")
pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
SWEEP = ["-m", "hydra/launcher=submitit_slurm", "hydra.launcher.gpus_per_node=8", "+recipe=ddp_bf16"]


def _env(path: str) -> dict[str, str]:
    kept = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_", "TORCHELASTIC_"))}
    python = str(Path(sys.executable).parent)
    return {**kept, "PATH": f"{path}{os.pathsep}{python}", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}


def test_without_srun_a_slurm_sweep_is_one_line_and_submits_nothing(tmp_path):
    sweep_dir = tmp_path / "sweep"
    args = [*SWEEP, "backend=nccl", "optim.lr=1e-3,3e-4", f"hydra.sweep.dir={sweep_dir}"]
    done = run_clorch_train(args, tmp_path, env=_env(str(tmp_path / "no-slurm")), timeout=100)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("  - ")]
    assert errors == [
        "  - hydra/launcher=submitit_slurm submits through SLURM's sbatch and srun, but sbatch and srun are "
        "not on this machine's PATH: run clorch-train on a SLURM login node (or load SLURM's module), or "
        "use hydra/launcher=submitit_local"
    ], done.stderr  # and not "backend 'nccl' needs CUDA GPUs": this machine's GPUs are not the nodes'
    assert not sweep_dir.exists()
