"""Resuming from a checkpoint continues training bit for bit, in one process and on 2 gloo ranks."""

from __future__ import annotations

import json
import os

import pytest
import torch

from clorch.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from clorch.data import DistributedSampler
from tests.checkpoint import toy_training as toy
from tests.harness import run_ranks

pytestmark = pytest.mark.timeout(90)


def test_resume_in_one_process_is_bit_identical(tmp_path):
    straight, resumed = toy.uninterrupted_and_resumed(str(tmp_path), rank=0, world_size=1)
    toy.assert_same(straight, resumed)


def test_files_on_disk_and_what_the_metadata_records(tmp_path):
    model, optimizer, sampler, scaler = toy.build(3, 1, 0)
    toy.train(model, optimizer, sampler, scaler, toy.dataset(), 2)
    path = tmp_path / "sub" / "model.ckpt"
    save_checkpoint(path, model=model, optimizer=optimizer, sampler=sampler, scaler=scaler, state={"epoch": 0})
    first = sorted(os.listdir(path.parent))
    save_checkpoint(path, model=model, state={"epoch": 1, "loss": [float("nan"), float("-inf"), 0.1]})
    second = sorted(os.listdir(path.parent))
    assert len(first) == len(second) == 2 and first != second  # the superseded archive is gone
    body = json.loads(path.read_text())
    assert body["format"] == "clorch-checkpoint" and body["torch_version"] == torch.__version__
    assert body["world_size"] == 1 and body["state"]["epoch"] == 1
    nan, inf, tenth = load_checkpoint(path, model=model)["loss"]  # a diverged loss still saves
    assert nan != nan and inf == float("-inf") and tenth == 0.1
    assert body["contents"] == {"model": True, "optimizer": False, "scaler": False}
    assert body["archive"]["file"] in second and len(body["archive"]["digest"]) == 32
    assert set(body["rng"][0]) == {"torch", "python", "numpy", "cuda"}
    with pytest.raises(ValueError, match="optimizer was given, but checkpoint .* holds no optimizer state"):
        load_checkpoint(path, model=model, optimizer=optimizer)


def _two_ranks(rank: int, world_size: int, directory: str) -> dict:
    """Resume on 2 ranks; then check that a one-rank failure raises on every rank."""
    straight, resumed = toy.uninterrupted_and_resumed(directory, rank, world_size)
    toy.assert_same(straight, resumed)
    default = DistributedSampler(11, seed=2)  # rank and num_replicas come from the group
    outcome = {
        "defaults": (default.rank, default.num_replicas),
        "sampler": resumed["sampler"],
        "param_sum": float(sum(p.double().sum() for p in resumed["params"])),
    }
    model, optimizer, sampler, scaler = toy.build(0, world_size, rank)
    # Rank 1 alone passes a bad state: nobody may hang waiting for it.
    bad_state = {"step": object()} if rank == 1 else {"step": 1}
    try:
        save_checkpoint(f"{directory}/bad.ckpt", model=model, state=bad_state)
    except (TypeError, CheckpointError) as exc:
        outcome["save_error"] = f"{type(exc).__name__}: {exc}"
    # Rank 0 alone asks for a file that is not there; rank 1's valid load must not happen either.
    before = [p.detach().clone() for p in model.parameters()]
    try:
        load_checkpoint(f"{directory}/run.ckpt" if rank == 1 else f"{directory}/nope.ckpt", model=model)
    except (FileNotFoundError, CheckpointError) as exc:
        outcome["load_error"] = f"{type(exc).__name__}: {exc}"
    outcome["untouched"] = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    return outcome


def test_resume_on_two_ranks_is_bit_identical_and_failures_reach_every_rank(tmp_path):
    results = run_ranks(_two_ranks, 2, str(tmp_path), timeout=80)
    assert [r["defaults"] for r in results] == [(0, 2), (1, 2)]
    assert results[0]["param_sum"] == results[1]["param_sum"]  # replicas stayed in sync
    assert results[0]["sampler"]["rank"] == 0 and results[1]["sampler"]["rank"] == 1
    assert results[1]["save_error"].startswith("TypeError: state['step'] must be JSON-serializable")
    assert results[0]["save_error"].startswith("CheckpointError: rank 1 failed to prepare checkpoint")
    assert results[0]["load_error"].startswith("FileNotFoundError: no checkpoint at")
    assert results[1]["load_error"].startswith("CheckpointError: rank 0 failed to read checkpoint")
    assert all(r["untouched"] for r in results)
    assert not (tmp_path / "bad.ckpt").exists()
