"""Sharded (DCP) checkpoints: resume onto another world size exactly, refuse another model, survive kill -9.

Resume: a run saves after step 3 of 6 and another world size continues it with
the same global batch of 8 (batch 4 x 2 ranks, or batch 4 x 1 rank x
accumulation 2). The continued run's losses and final weights are compared
with the uninterrupted run's: losses to rtol 1e-5, weights to atol 1e-4. Not
bit-exact because the same per-step gradient is summed in another order (two
ranks' means averaged by an all-reduce or a reduce-scatter against two
micro-batches accumulated on one rank), and AdamW's division by the running
RMS magnifies last-bit differences of near-zero gradients (tests/nn/test_fsdp.py
measures the same effect at 2e-5).
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

import pytest
import torch

import clorch.checkpoint.sharded as sharded
from clorch.checkpoint.errors import CheckpointError
from clorch.checkpoint.sharded import (
    MARKER,
    latest_sharded_checkpoint,
    load_sharded,
    prune_sharded_checkpoints,
    save_sharded,
    sharded_step_path,
)
from clorch.models.gpt import GPT, GPTConfig
from tests.harness import RankFailure, run_ranks
from clorch.checkpoint.sharded_marker import read_marker
from clorch.nn.parallel.fsdp import shard_model
from tests.nn.fsdp_training import Run, build, full_weights, train, train_each

pytestmark = pytest.mark.timeout(300)

LOSS_RTOL, WEIGHT_ATOL = 1e-5, 1e-4
K, SAVE_AT = 6, 3


def _agree(resumed: dict, uninterrupted: dict) -> None:
    assert resumed["losses"] == pytest.approx(uninterrupted["losses"][SAVE_AT:], rel=LOSS_RTOL)
    worst = max(
        (resumed["weights"][k] - uninterrupted["weights"][k]).abs().max().item() for k in uninterrupted["weights"]
    )
    assert worst <= WEIGHT_ATOL


def _refuse_other_model(rank: int, world_size: int, path: str) -> str:
    with torch.device("meta"):
        other = GPT(GPTConfig(vocab_size=64, seq_len=16, n_layer=2, n_head=2, d_model=16))
    other.to_empty(device="cpu")
    with pytest.raises(CheckpointError) as caught:
        load_sharded(path, model=other)
    return str(caught.value)


def _batchnorm_model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    shard_model(model)
    return model


def _batchnorm_steps(model, optimizer, rank: int, start: int, stop: int) -> None:
    for step in range(start, stop):  # each rank its own batches: its own running statistics
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(100 * step + rank))
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def _local(model) -> dict[str, torch.Tensor]:
    return {k: (v.to_local() if hasattr(v, "to_local") else v).detach().clone() for k, v in model.state_dict().items()}


def _batchnorm_resume_and_damage(rank: int, world_size: int, directory: str) -> tuple[dict, str]:
    """Same-size resume of a sharded BatchNorm model: every rank's state (buffers too) as the
    uninterrupted run's. Then one rank's share of the verification finds a flipped byte, and
    every rank refuses the load."""
    path = f"{directory}/bn.dcp"
    model = _batchnorm_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    _batchnorm_steps(model, optimizer, rank, 0, 2)
    save_sharded(path, model=model, optimizer=optimizer)
    _batchnorm_steps(model, optimizer, rank, 2, 4)
    resumed = _batchnorm_model()
    optimizer = torch.optim.SGD(resumed.parameters(), lr=0.1)
    load_sharded(path, model=resumed, optimizer=optimizer)
    _batchnorm_steps(resumed, optimizer, rank, 2, 4)
    expected, got = _local(model), _local(resumed)
    differences = {k: (expected[k].float() - got[k].float()).abs().max().item() for k in expected}
    if rank == 0:  # rank 1 verifies __0_0.distcp (files in name order, one in two from its own)
        shard = Path(path, "__0_0.distcp")
        data = bytearray(shard.read_bytes())
        data[-100] ^= 0xFF
        shard.write_bytes(bytes(data))
    torch.distributed.barrier()
    with pytest.raises(CheckpointError) as refused:
        load_sharded(path, model=_batchnorm_model())
    return differences, str(refused.value)


def _resume_and_refuse(rank: int, world_size: int, run: Run, other_model_path: str, directory: str) -> tuple:
    return (
        train(rank, world_size, run),
        _refuse_other_model(rank, world_size, other_model_path),
        _batchnorm_resume_and_damage(rank, world_size, directory),
    )


def test_resume_onto_another_world_size_matches_the_uninterrupted_run(tmp_path):
    ddp2, fsdp2, one = (str(tmp_path / name) for name in ("ddp2", "fsdp2", "one"))
    saved = dict(steps=K, save_at=SAVE_AT)
    # 2 ranks, uninterrupted, each saving after step 3 on the way (saving changes nothing).
    by_two = run_ranks(
        train_each, 2, [Run(mode="ddp", save_to=ddp2, **saved), Run(mode="fsdp", save_to=fsdp2, **saved)], timeout=200
    )[0]
    step = f"step_{SAVE_AT:08d}.dcp"
    # 1 rank with accumulation 2: continue both, and run its own uninterrupted run.
    on_one = dict(mode="single", steps=K, accumulation=2)
    by_one = run_ranks(
        train_each,
        1,
        [
            Run(resume_from=f"{ddp2}/{step}", **on_one),
            Run(resume_from=f"{fsdp2}/{step}", **on_one),
            Run(save_to=one, **on_one, save_at=SAVE_AT),
        ],
        timeout=200,
    )[0]
    _agree(by_one[0], by_two[0])  # ddp 2 -> 1
    _agree(by_one[1], by_two[1])  # fsdp 2 -> 1 (unsharded)
    # 1 -> 2 ranks, sharded, in the same launch as the refusal of another model and a
    # BatchNorm model's same-size resume.
    run = Run(mode="fsdp", steps=K, resume_from=f"{one}/{step}")
    results = run_ranks(_resume_and_refuse, 2, run, f"{ddp2}/{step}", str(tmp_path), timeout=200)
    for rank, (resumed, refusal, (batchnorm, damaged)) in enumerate(results):
        _agree(resumed, by_one[2])
        assert "holds another model" in refusal and "blocks.0.attn.qkv.weight" in refusal
        assert "[48, 16]" in refusal and "[96, 32]" in refusal
        assert batchnorm == dict.fromkeys(batchnorm, 0.0) and "1.running_mean" in batchnorm
        assert f"{tmp_path}/bn.dcp/__0_0.distcp is corrupt" in damaged
        assert ("rank 1 failed" in damaged) == (rank == 0)
    assert {"1.running_mean", "1.running_var"} <= set(read_marker(tmp_path / "bn.dcp")["rank_buffers"])
    # Per-rank shards on disk, one file each.
    assert sorted(p.name for p in Path(fsdp2, step).glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]


def _save_then_die(rank: int, world_size: int, directory: str, point: str) -> None:
    run = Run(mode="fsdp", steps=1)
    model = build(run)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randint(0, 64, (2, 16))).float().mean().backward()
    optimizer.step()
    save_sharded(sharded_step_path(directory, 1), model=model, optimizer=optimizer, state={"step": 1})
    weights = full_weights(model)
    if rank == 0:
        torch.save(weights, Path(directory) / "expected.pt")
    optimizer.step()  # the second save must differ from the first
    real_save, real_commit = sharded.dcp.save, sharded.commit

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def save(*args, **kwargs):
        if point == "before shards" and rank == 1:
            die()
        real_save(*args, **kwargs)
        if point == "after shards" and rank == 0:
            die()

    def commit(temporary, target):
        if point == "before rename" and target.suffix == ".dcp":
            die()
        real_commit(temporary, target)

    sharded.dcp.save, sharded.commit = save, commit
    save_sharded(sharded_step_path(directory, 2), model=model, optimizer=optimizer, state={"step": 2})


POINTS = ["before shards", "after shards", "before rename"]


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> dict[str, tuple[Path, Future]]:
    """{point: (its directory, the future of its 2-rank job)}: the three jobs run side by side, each
    killed at its point; a job's rank that outlives the kill waits out the harness's grace, so
    running them together overlaps those waits."""
    jobs = {point: tmp_path_factory.mktemp("kill_9") for point in POINTS}
    with ThreadPoolExecutor(len(POINTS)) as pool:
        futures = {
            point: pool.submit(run_ranks, _save_then_die, 2, str(where), point, timeout=120, grace=2.0)
            for point, where in jobs.items()
        }
        wait(futures.values())
    return {point: (jobs[point], futures[point]) for point in POINTS}


@pytest.mark.parametrize("point", POINTS)
def test_kill_9_during_a_sharded_save_leaves_the_previous_checkpoint_latest_and_loadable(killed, point):
    tmp_path, job = killed[point]
    with pytest.raises(RankFailure, match="exit code -9"):
        job.result()  # the job's own outcome: its RankFailure is raised here
    first = sharded_step_path(tmp_path, 1)
    assert latest_sharded_checkpoint(tmp_path) == first
    assert not sharded_step_path(tmp_path, 2).exists()
    [leftover] = tmp_path.glob(".step_00000002.dcp.*.tmp")  # the interrupted save, hidden
    assert (leftover / MARKER).exists() == (point == "before rename")
    if point == "after shards":
        with pytest.raises(CheckpointError, match="incomplete"):
            load_sharded(leftover, model=build(Run(mode="single")))
    model = build(Run(mode="single"))
    with pytest.warns(UserWarning, match="saved by world_size 2, this job has 1: RNG states not restored"):
        assert load_sharded(first, model=model) == {"step": 1}
    expected = torch.load(tmp_path / "expected.pt")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items())
    # The next save and prune take over; the interrupted leftover goes with the older steps.
    save_sharded(sharded_step_path(tmp_path, 3), model=model, state={"step": 3})
    assert prune_sharded_checkpoints(tmp_path, keep_last=1) == [first, leftover]
    assert latest_sharded_checkpoint(tmp_path) == sharded_step_path(tmp_path, 3)


def test_refusals_in_one_process(tmp_path):
    model = build(Run(mode="single"))
    (tmp_path / "not_a_checkpoint").mkdir()
    with pytest.raises(CheckpointError, match="not a clorch sharded checkpoint: nothing was written"):
        save_sharded(tmp_path / "not_a_checkpoint", model=model)
    with pytest.raises(CheckpointError, match="incomplete"):
        load_sharded(tmp_path / "not_a_checkpoint", model=model)
    with pytest.raises(FileNotFoundError):
        load_sharded(tmp_path / "absent", model=model)
    path = save_sharded(tmp_path / "plain.dcp", model=model, state={"step": 0})
    with pytest.raises(CheckpointError, match="holds no optimizer state"):
        load_sharded(path, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(TypeError):
        save_sharded(tmp_path / "bad.dcp", model=model, state={"step": object()})
    assert not (tmp_path / "bad.dcp").exists()
    # Saving again at the same path replaces the checkpoint whole.
    with torch.no_grad():
        model.ln_f.weight.add_(1.0)
    save_sharded(path, model=model, state={"step": 1})
    fresh = build(Run(mode="single"))
    assert load_sharded(path, model=fresh) == {"step": 1}
    assert torch.equal(fresh.ln_f.weight, model.ln_f.weight)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
