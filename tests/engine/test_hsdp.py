"""`clorch-train parallel=hsdp` on 4 CPU ranks over gloo: 2 replicas, each sharded over 2 ranks.

One tiny GPT (2 blocks), fp32, gradient clipping that acts, 4 steps. The first process
trains the same job under parallel=ddp, parallel=fsdp and parallel=hsdp
(parallel.replicate=2, periodic sharded checkpoints); the second resumes hsdp's step-2
checkpoint under parallel=fsdp on 2 ranks (accumulation 2 keeps the global batch) and
runs the refusals. The exported weights (checkpoint.export=safetensors) of the three
modes agree within 1e-6: they start from the same seeded weights and read the same
batches, and differ only in the order the gradients are summed in fp32.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from clorch.config.layout import ParallelLayout
from clorch.config.options.parallel import DDPParallelConfig, FSDPParallelConfig, HSDPParallelConfig
from tests.clirunner import run_clorch_train_batch

JOB = [
    "backend=gloo",
    "precision=fp32",
    "model=gpt",
    "data=arithmetic",
    "model.n_layer=2",
    "model.d_model=32",
    "model.n_head=2",
    "data.sample_count=128",
    "batch_size=4",
    "max_steps=4",
    "log_every=1",
    "eval_every=0",
    "optim.grad_clip=0.5",
    "logger.progress=off",
    "checkpoint.export=safetensors",
]
HSDP = ["parallel=hsdp", "parallel.replicate=2"]
WEIGHT_ATOL = 1e-6
RESUMED_ATOL = 1e-5  # another world size: each step's gradient summed in another order, then AdamW


def _args(run: Path, ranks: int, *more: str) -> list[str]:
    return [*JOB, f"launcher.nproc_per_node={ranks}", *more, f"hydra.run.dir={run}"]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "model.safetensors")


def _close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], atol: float) -> None:
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=atol, msg=name)


def test_the_layout_of_each_mode():
    hsdp = HSDPParallelConfig(replicate=2).layout(4)
    assert (hsdp.replicate, hsdp.shard_size, hsdp.dp_size, hsdp.sharded) == (2, 2, 4, True)
    assert [(hsdp.replica_of(r), hsdp.shard_of(r), hsdp.dp_rank(r)) for r in range(4)] == [
        (0, 0, 0), (0, 1, 1), (1, 0, 2), (1, 1, 3)
    ]  # fmt: skip
    assert hsdp.mesh_shape == (2, 2) and hsdp.describe() == "2 replicas x 2 shards"
    ddp, fsdp = DDPParallelConfig().layout(4), FSDPParallelConfig().layout(4)
    assert (ddp.replicate, ddp.shard_size, ddp.dp_size, ddp.sharded) == (4, 1, 4, False)
    assert (fsdp.replicate, fsdp.shard_size, fsdp.dp_size, fsdp.sharded) == (1, 4, 4, True)
    with pytest.raises(ValueError, match="replicate=3 must divide world_size=4"):
        ParallelLayout(4, 3, sharded=True)
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, 4\), got 4"):
        hsdp.dp_rank(4)


@pytest.mark.timeout(300)
def test_hsdp_trains_as_ddp_and_fsdp_saves_sharded_and_resumes_under_fsdp_on_2_ranks(tmp_path):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    runs = {name: tmp_path / name for name in ("ddp", "fsdp", "hsdp", "resumed")}
    periodic = ["checkpoint=periodic", "checkpoint.every_n_steps=2", "checkpoint.keep_last=2"]
    first = run_clorch_train_batch(
        [
            (_args(runs["ddp"], 4), tmp_path),
            (_args(runs["fsdp"], 4, "parallel=fsdp"), tmp_path),
            (_args(runs["hsdp"], 4, *HSDP, *periodic), tmp_path),
        ],
        env=env,
        timeout=240,
    )
    for done in first:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    checkpoints = runs["hsdp"] / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("*.dcp")) == ["final.dcp", "step_00000002.dcp", "step_00000004.dcp"]
    assert len(list((checkpoints / "final.dcp").glob("*.distcp"))) == 4  # every rank wrote its shards
    hsdp = _weights(runs["hsdp"])
    _close(hsdp, _weights(runs["ddp"]), WEIGHT_ATOL)
    _close(hsdp, _weights(runs["fsdp"]), WEIGHT_ATOL)

    step2 = checkpoints / "step_00000002.dcp"
    second = run_clorch_train_batch(
        [
            (_args(runs["resumed"], 2, "parallel=fsdp", f"checkpoint.resume={step2}"), tmp_path),
            (_args(tmp_path / "r3", 4, "parallel=hsdp", "parallel.replicate=3"), tmp_path),
            (_args(tmp_path / "r4", 4, "parallel=hsdp", "parallel.replicate=4"), tmp_path),
            (_args(tmp_path / "r1", 4, "parallel=hsdp", "parallel.replicate=1"), tmp_path),
        ],
        env=env,
        timeout=200,
    )
    resumed, r3, r4, r1 = second
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    summary = json.loads((runs["resumed"] / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["resumed_from"] == str(step2)
    assert "world size 4 -> 2, accumulation 1 -> 2" in resumed.stdout + resumed.stderr
    _close(_weights(runs["resumed"]), hsdp, RESUMED_ATOL)

    for done in (r3, r4, r1):
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "parallel.replicate=3 must divide the job's 4 ranks into equal shard groups: use parallel.replicate=2" in (
        r3.stderr
    )
    assert "parallel.replicate=4 leaves one rank per shard group" in r4.stderr and "that is parallel=ddp" in r4.stderr
    assert "parallel.replicate=1 is one replica sharded over every rank: that is parallel=fsdp" in r1.stderr
    assert not any((tmp_path / name).exists() for name in ("r3", "r4", "r1"))


def test_the_extending_pages_worked_example_is_the_shipped_code():
    """docs/extending.md shows parallel=hsdp's strategy and option as clorch ships them: each line
    of its two excerpts is a line of the file it names (docstrings and imports left out)."""
    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "extending.md").read_text()
    blocks = re.findall(
        r"^```python\n# (clorch/\S+\.py), (?:as clorch ships it|in part)[^\n]*\n(.*?)^```", page, re.S | re.M
    )
    assert [path for path, _ in blocks] == ["clorch/strategies/hsdp.py", "clorch/config/options/parallel.py"]
    for path, code in blocks:
        shipped = {line.strip() for line in (root / path).read_text().splitlines()}
        shown = [line.strip() for line in code.splitlines() if line.strip() and not line.strip().startswith("...")]
        assert [line for line in shown if line not in shipped] == [], path
