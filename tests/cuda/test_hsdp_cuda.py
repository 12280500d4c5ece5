"""GPU tier: `clorch-train parallel=hsdp` over nccl, 2 replicas each sharded over half the GPUs.

Hybrid sharding needs shard groups of 2 or more ranks and 2 or more replicas, so 4 GPUs at
least (an even number): skipped with fewer. bf16, a tiny GPT, 4 steps: the exported weights
agree with parallel=fsdp's on the same GPUs to bf16's rounding of the summed gradients.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.clirunner import run_clorch_train_batch

GPUS = torch.cuda.device_count()
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.timeout(600),
    pytest.mark.skipif(GPUS < 4 or GPUS % 2, reason=f"parallel=hsdp needs 4 or more GPUs, an even number; {GPUS} here"),
]

JOB = [
    "backend=nccl",
    "precision=bf16",
    "model=gpt",
    "data=arithmetic",
    "model.n_layer=2",
    "model.d_model=64",
    "model.n_head=2",
    "data.sample_count=512",
    "batch_size=8",
    "max_steps=4",
    "eval_every=0",
    "logger.progress=off",
    "checkpoint=final",
    "checkpoint.export=safetensors",
    f"launcher.nproc_per_node={GPUS}",
]


def test_hsdp_on_gpus_trains_as_fsdp_and_writes_sharded_checkpoints(tmp_path: Path):
    runs = {"fsdp": tmp_path / "fsdp", "hsdp": tmp_path / "hsdp"}
    done = run_clorch_train_batch(
        [
            ([*JOB, "parallel=fsdp", f"hydra.run.dir={runs['fsdp']}"], tmp_path),
            ([*JOB, "parallel=hsdp", "parallel.replicate=2", f"hydra.run.dir={runs['hsdp']}"], tmp_path),
        ],
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        timeout=540,
    )
    for result in done:
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert len(list((runs["hsdp"] / "checkpoints" / "final.dcp").glob("*.distcp"))) == GPUS
    fsdp, hsdp = (load_file(run / "model.safetensors") for run in (runs["fsdp"], runs["hsdp"]))
    assert sorted(fsdp) == sorted(hsdp)
    for name, value in fsdp.items():
        torch.testing.assert_close(hsdp[name], value, rtol=2e-2, atol=2e-3, msg=name)
