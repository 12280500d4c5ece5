"""`clorch-train` resumed on another world size against the uninterrupted run, on CPU ranks over gloo.

One tiny MLP regression (fp32, AdamW, a cosine schedule with warmup, gradient
clipping), 96 training samples in micro-batches of 8, a global batch of 16:
6 optimizer steps an epoch, 2 epochs. Five launches in three rounds (each
round's launches run at once, so a 1-rank run shares the 2 cores with another):

1. `ddp2`: 2 ranks, accumulation 1, a checkpoint every 2 steps; `fsdp2`: the same
   under parallel=fsdp, a checkpoint every 4 steps.
2. `ddp1`: 1 rank from ddp2's step 2 checkpoint (2 -> 1: the plan sets accumulation
   to 2); `fsdp1`: 1 rank from fsdp2's step 4 (a sharded checkpoint, resharded).
3. `ddp2b`: 2 ranks from ddp1's step 4 checkpoint (1 -> 2, accumulation 2 -> 1),
   which ddp1 wrote in the middle of the epoch it continued from 2 ranks; and a
   resume on 3 ranks, refused before launch.

Beside rounds 1 and 2, `bn2` and `bn1` do what ddp2 and ddp1 do with a BatchNorm model
(tests.models.state_models.NormDropoutNet, without dropout): the resume is warned of, and
differs from the uninterrupted run as docs/scale-out.md says.

A resumed run's checkpoint is what a run stopped right after that step leaves
(checkpoints are atomic, and nothing after a step changes what it saved), so
each reference is the run whose checkpoint is resumed: ddp2 for ddp1, ddp1 for
ddp2b (1 -> 2 against the 1-rank run that continued uninterrupted), fsdp2 for
fsdp1. Both resumed epochs are continued from another world size's layout, and
every resumed run crosses into a new epoch.

Tolerance: 1e-6 absolute on each final weight (weights are at most about 0.5) and
1e-5 relative on each step's loss. Each optimizer step averages the same 16 samples
in both runs; only the order of the sums differs (2 ranks' all-reduce of 8-sample
means against one rank's 2 micro-batches), which rounds differently in fp32: about
1e-7 relative a step. AdamW's update m / (sqrt(v) + eps) carries a relative change
of the gradient into the step about unchanged, so 10 steps at lr <= 3e-3 move a
weight by at most about 1e-8 more (measured: 1.5e-8); 1e-6 leaves a margin of 60 and
is 1e-4 of what one step of a wrong batch changes here (the losses of two different
batches differ by 1e-2 to 1e-1).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from clorch.train.checkpoints import reseed_for
from clorch.train.metrics import read_metrics
from tests.clirunner import start_clorch_train

pytestmark = pytest.mark.timeout(300)

JOB = [
    "backend=gloo",
    "precision=fp32",
    "model=mlp",
    "data=synthetic",
    "model.hidden_features=16",
    "data.sample_count=96",
    "data.in_features=8",
    "data.out_features=4",
    "batch_size=8",
    "epochs=2",
    "log_every=1",
    "optim.lr=3e-3",
    "optim.grad_clip=0.5",
    "schedule=cosine",
    "schedule.warmup_steps=3",
    "logger.progress=off",
    "checkpoint=periodic",
    "checkpoint.keep_last=8",
    "checkpoint.export=safetensors",
]
STEPS = 12  # 96 samples / a global batch of 16, x 2 epochs
WEIGHT_ATOL, LOSS_RTOL = 1e-6, 1e-5
# The same job with a BatchNorm model (hidden width 16 too) in place of the MLP.
BATCH_NORM = [
    *(a for a in JOB if not a.startswith("model")),
    "model._target_=tests.models.state_models.NormDropoutNet",
    "model.dropout=0.0",
]


def _start(tmp: Path, name: str, *args: str, job: list[str] = JOB):
    run = tmp / name
    run.mkdir(parents=True)
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "CLORCH_TRUSTED_MODULES": "tests"}
    return name, start_clorch_train([*job, *args, f"hydra.run.dir={run / 'run'}"], run, env=env)


def _finish(*started) -> dict[str, subprocess.CompletedProcess]:
    done = {}
    for name, proc in started:
        out, err = proc.communicate(timeout=240)
        done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reshard")
    names = ("ddp2", "fsdp2", "ddp1", "fsdp1", "ddp2b", "refused", "bn2", "bn1")
    dirs = {name: tmp / name / "run" for name in names}
    done = _finish(
        _start(tmp, "ddp2", "launcher.nproc_per_node=2", "checkpoint.every_n_steps=2"),
        _start(tmp, "fsdp2", "launcher.nproc_per_node=2", "parallel=fsdp", "checkpoint.every_n_steps=4"),
        _start(tmp, "bn2", "launcher.nproc_per_node=2", "checkpoint.every_n_steps=2", job=BATCH_NORM),
    )
    for name in ("ddp2", "fsdp2", "bn2"):
        assert done[name].returncode == 0, done[name].stderr
    done |= _finish(
        _start(
            tmp,
            "ddp1",
            "launcher.nproc_per_node=1",
            "checkpoint.every_n_steps=2",
            f"checkpoint.resume={dirs['ddp2'] / 'checkpoints' / 'step_00000002.ckpt'}",
        ),
        _start(
            tmp,
            "fsdp1",
            "launcher.nproc_per_node=1",
            "parallel=fsdp",
            "checkpoint.every_n_steps=4",
            f"checkpoint.resume={dirs['fsdp2'] / 'checkpoints' / 'step_00000004.dcp'}",
        ),
        _start(
            tmp,
            "bn1",
            "launcher.nproc_per_node=1",
            "checkpoint.every_n_steps=2",
            "logger.progress=lines",  # the console shows the run's events
            f"checkpoint.resume={dirs['bn2'] / 'checkpoints' / 'step_00000002.ckpt'}",
            job=BATCH_NORM,
        ),
    )
    for name in ("ddp1", "fsdp1", "bn1"):
        assert done[name].returncode == 0, done[name].stderr
    done |= _finish(
        _start(
            tmp,
            "ddp2b",
            "launcher.nproc_per_node=2",
            "accumulation=2",  # as ddp1's config says: the plan sets it back to 1
            "checkpoint.every_n_steps=2",
            f"checkpoint.resume={dirs['ddp1'] / 'checkpoints' / 'step_00000004.ckpt'}",
        ),
        _start(
            tmp,
            "refused",
            "launcher.nproc_per_node=3",
            f"checkpoint.resume={dirs['ddp2'] / 'checkpoints' / 'step_00000002.ckpt'}",
        ),
    )
    return done, dirs


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "model.safetensors")


def _train_records(run_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"}


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _assert_continues(runs, resumed: str, reference: str, from_step: int) -> None:
    """The resumed run ends where the reference does, step by step after the checkpoint."""
    done, dirs = runs
    assert done[resumed].returncode == 0, done[resumed].stderr
    assert _summary(dirs[resumed])["steps"] == STEPS
    mine, theirs = _weights(dirs[resumed]), _weights(dirs[reference])
    assert mine.keys() == theirs.keys()
    for name in theirs:
        torch.testing.assert_close(mine[name], theirs[name], rtol=0, atol=WEIGHT_ATOL, msg=name)
    ours, ref = _train_records(dirs[resumed]), _train_records(dirs[reference])
    assert sorted(ours) == list(range(1, STEPS + 1))
    for step in range(from_step + 1, STEPS + 1):
        # The schedule continues: the same learning rate each step, exactly.
        assert ours[step]["lr"] == ref[step]["lr"], step
        assert ours[step]["loss"] == pytest.approx(ref[step]["loss"], rel=LOSS_RTOL), step
        assert ours[step]["epoch"] == ref[step]["epoch"], step


def _config_accumulation(run_dir: Path) -> int:
    return yaml.safe_load((run_dir / "config.yaml").read_text())["accumulation"]


def test_two_ranks_resumed_on_one_reach_the_uninterrupted_weights(runs):
    done, dirs = runs
    _assert_continues(runs, "ddp1", "ddp2", 2)
    line = "clorch: resume: world size 2 -> 1, accumulation 1 -> 2 keeps the global batch of 16"
    assert line in done["ddp1"].stdout, done["ddp1"].stdout
    assert _config_accumulation(dirs["ddp1"]) == 2
    events = [json.loads(x) for x in (dirs["ddp1"] / "events.jsonl").read_text().splitlines()]
    assert [e.get("resharded") for e in events if "resharded" in e] == [line.removeprefix("clorch: resume: ")]


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]


def test_batch_norm_resumed_on_another_world_size_is_warned_of_and_differs_as_documented(runs):
    done, dirs = runs
    assert done["bn1"].returncode == 0, done["bn1"].stderr
    assert _summary(dirs["bn1"])["steps"] == STEPS
    # The console and events.jsonl say which module and what differs; a model without BatchNorm gets no such line.
    line = (
        "clorch: warning: NormDropoutNet's batch statistics (norm) do not carry over from 2 to 1 rank(s): each "
        "step's samples are grouped into other micro-batches, which BatchNorm normalizes by their own statistics, "
        "and the running statistics now move 2 time(s) a step, from other micro-batches; losses, weights, running "
        "statistics and eval leave the uninterrupted run's (docs/scale-out.md, What is kept)"
    )
    assert line in done["bn1"].stderr, done["bn1"].stderr  # the progress's stream
    assert [e["message"] for e in _events(dirs["bn1"]) if e.get("batch_statistics")] == [line.removeprefix("clorch: ")]
    assert not any(e.get("batch_statistics") for e in _events(dirs["ddp1"]))
    # What the warning says, against the uninterrupted run: the same schedule, and the same samples
    # each step (the carried records are bn2's own); the running statistics moved once a step on
    # 2 ranks (rank 0's forwards) and twice a step on 1 rank after step 2; the weights left bn2's.
    ours, ref = _train_records(dirs["bn1"]), _train_records(dirs["bn2"])
    assert [ours[s]["lr"] for s in range(1, STEPS + 1)] == [ref[s]["lr"] for s in range(1, STEPS + 1)]
    assert [ours[s]["loss"] for s in (1, 2)] == [ref[s]["loss"] for s in (1, 2)]
    mine, theirs = _weights(dirs["bn1"]), _weights(dirs["bn2"])
    assert theirs["norm.num_batches_tracked"].item() == STEPS
    assert mine["norm.num_batches_tracked"].item() == 2 + 2 * (STEPS - 2)
    assert (mine["inp.weight"] - theirs["inp.weight"]).abs().max() > 100 * WEIGHT_ATOL
    assert not torch.equal(mine["norm.running_var"], theirs["norm.running_var"])


def test_one_rank_resumed_on_two_reaches_the_uninterrupted_weights(runs):
    done, dirs = runs
    # ddp1's step 4 checkpoint was written while it continued ddp2's epoch (a global position only).
    _assert_continues(runs, "ddp2b", "ddp1", 4)
    assert "resume: world size 1 -> 2, accumulation 2 -> 1 keeps the global batch of 16" in done["ddp2b"].stdout
    assert _config_accumulation(dirs["ddp2b"]) == 1


def test_fsdp_two_ranks_resumed_on_one_reach_the_uninterrupted_weights(runs):
    done, dirs = runs
    _assert_continues(runs, "fsdp1", "fsdp2", 4)
    assert "resume: world size 2 -> 1, accumulation 1 -> 2 keeps the global batch of 16" in done["fsdp1"].stdout


def test_a_world_size_that_cannot_keep_the_global_batch_is_refused_before_launch(runs):
    done, dirs = runs
    refused = done["refused"]
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    message = refused.stderr
    for part in (
        "checkpoint.resume=",
        "the global batch 16 = batch_size 8 x 2 ranks x accumulation 1",
        "which this job's 3 ranks (launcher.nproc_per_node) cannot keep",
        "16 is not a multiple of batch_size 8 x 3 = 24",
        "(1, 2 ranks)",
    ):
        assert part in message, message
    # Refused before launch: no rank started, nothing was trained.
    assert not (dirs["refused"] / "metrics.jsonl").exists()
    assert not (dirs["refused"] / "logs").exists()


def test_reseeding_on_another_world_size_is_per_rank_and_reproducible():
    draws = {}
    for rank in (0, 1):
        for step in (4, 5):
            reseed_for(0, rank, step)
            draws[rank, step] = torch.rand(4)
    reseed_for(0, 1, 4)
    assert torch.equal(torch.rand(4), draws[1, 4])
    values = [tuple(v.tolist()) for v in draws.values()]
    assert len(set(values)) == len(values)
