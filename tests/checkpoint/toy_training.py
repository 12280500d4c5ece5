"""A small training run that uses every kind of state a checkpoint must carry.

Each step draws from all three CPU generators (dropout: torch; input noise:
Python's random and numpy), reads its batch from the DistributedSampler,
scales the loss with a toy scaler whose state changes, averages gradients over
the process group when there is one, and takes an AdamW step.

`ToyScaler` stands in for clorch.amp.GradScaler (being written in parallel):
the checkpoint only needs state_dict()/load_state_dict(), which it has.
"""

from __future__ import annotations

import random

import numpy as np
import torch

import clorch.distributed as cd
from clorch.data import DistributedSampler

DATASET_SIZE = 40
BATCH = 4


class ToyScaler:
    """Loss scaling whose scale and growth tracker change every step."""

    def __init__(self) -> None:
        self.scale = 1024.0
        self.tracker = 0

    def update(self) -> None:
        self.tracker += 1
        if self.tracker % 3 == 0:
            self.scale *= 2.0

    def state_dict(self) -> dict:
        return {"scale": self.scale, "tracker": self.tracker, "history": torch.tensor([self.scale, 1.5])}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self.tracker = state["scale"], state["tracker"]


def dataset() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(2024)
    return torch.randn(DATASET_SIZE, 6, generator=gen), torch.randn(DATASET_SIZE, 2, generator=gen)


def build(seed: int, world_size: int, rank: int):
    """Model, AdamW, sampler and scaler, freshly made; `seed` decides the initial weights."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Dropout(0.3), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    sampler = DistributedSampler(DATASET_SIZE, num_replicas=world_size, rank=rank, seed=31)
    return model, optimizer, sampler, ToyScaler()


def scramble_rng(seed: int) -> None:
    """Put every generator somewhere else, as a fresh process would be."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def train(model, optimizer, sampler, scaler, data, steps: int) -> None:
    """`steps` optimizer steps, moving to the next epoch whenever one is used up."""
    inputs, targets = data
    for _ in range(steps):
        if sampler.remaining() < BATCH:
            sampler.set_epoch(sampler.epoch + 1)
        indices = sampler.sample_indices()[:BATCH]
        noise = torch.tensor([random.gauss(0, 0.1) for _ in range(6)], dtype=torch.float32)
        jitter = torch.from_numpy(np.random.standard_normal(2).astype(np.float32)) * 0.05
        out = model(inputs[indices] + noise)
        loss = ((out - targets[indices] - jitter) ** 2).mean() * scaler.scale
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            p.grad /= scaler.scale
            if cd.is_initialized():
                cd.all_reduce(p.grad, op="avg")
        optimizer.step()
        scaler.update()
        sampler.advance(len(indices))


def snapshot(model, optimizer, sampler, scaler) -> dict:
    """Everything that must match bit for bit, plus the next draw of every generator."""
    opt_state = optimizer.state_dict()["state"]
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "moments": [t.clone() for entry in opt_state.values() for t in entry.values()],
        "sampler": sampler.state_dict(),
        "scaler": (scaler.scale, scaler.tracker),
        "draws": (torch.rand(3), random.random(), float(np.random.rand())),
    }


def assert_same(a: dict, b: dict) -> None:
    assert all(torch.equal(x, y) for x, y in zip(a["params"], b["params"], strict=True)), "weights differ"
    assert all(torch.equal(x, y) for x, y in zip(a["moments"], b["moments"], strict=True)), "AdamW differs"
    assert a["sampler"] == b["sampler"] and a["scaler"] == b["scaler"]
    assert torch.equal(a["draws"][0], b["draws"][0]) and a["draws"][1:] == b["draws"][1:], "RNG differs"


def uninterrupted_and_resumed(
    directory: str, rank: int, world_size: int, total: int = 13, at: int = 7
) -> tuple[dict, dict]:
    """Train `total` steps straight (saving at `at`), then resume from that save in fresh objects."""
    from clorch.checkpoint import load_checkpoint, save_checkpoint

    data = dataset()
    scramble_rng(1)
    model, optimizer, sampler, scaler = build(0, world_size, rank)
    train(model, optimizer, sampler, scaler, data, at)
    path = f"{directory}/run.ckpt"
    save_checkpoint(
        path,
        model=model,
        optimizer=optimizer,
        sampler=sampler,
        scaler=scaler,
        state={"step": at, "epoch": sampler.epoch, "note": ("mid", "epoch")},
    )
    train(model, optimizer, sampler, scaler, data, total - at)
    straight = snapshot(model, optimizer, sampler, scaler)

    scramble_rng(99)
    model, optimizer, sampler, scaler = build(5, world_size, rank)  # other initial weights
    state = load_checkpoint(path, model=model, optimizer=optimizer, sampler=sampler, scaler=scaler)
    assert state == {"step": at, "epoch": sampler.epoch, "note": ["mid", "epoch"]}, state
    assert sampler.remaining() not in (0, len(sampler)), "the save should fall mid-epoch"
    train(model, optimizer, sampler, scaler, data, total - state["step"])
    return straight, snapshot(model, optimizer, sampler, scaler)
