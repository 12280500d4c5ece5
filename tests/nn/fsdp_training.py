"""One small GPT training loop for the sharding tests: one process, clorch's DDP or fsdp, same data.

Every variant trains the same seeded model (built on meta, `materialize`d) on
the same random tokens in the order of clorch's DistributedSampler, with the
same global batch (batch_size x world x accumulation). `train` is what a
rank runs (through tests/harness.py, or in the test process for one process);
it can save a sharded checkpoint after a chosen step and start from one.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

import clorch.distributed as cdist
from clorch.checkpoint.sharded import load_sharded, save_sharded
from clorch.data.sampler import DistributedSampler
from clorch.models.gpt import GPT, GPTConfig
from clorch.nn.parallel import DistributedDataParallel
from clorch.nn.parallel.fsdp import (
    apply_activation_checkpointing,
    clip_grad_norm_,
    gpt_init_fn,
    materialize,
    shard_model,
)

CONFIG = GPTConfig(vocab_size=64, seq_len=16, n_layer=2, n_head=2, d_model=32)
SAMPLES = 52  # not a multiple of the global batch: the epoch's padding is exercised too
DATA_SEED, MODEL_SEED, SAMPLER_SEED = 123, 7, 5


@dataclass(frozen=True)
class Run:
    mode: str = "fsdp"  # "fsdp", "ddp" (clorch's reducer) or "single" (no wrapper)
    steps: int = 4
    batch_size: int = 4  # per rank and micro-batch
    accumulation: int = 1
    precision: str = "fp32"
    checkpointing: bool = False
    cpu_offload: bool = False
    reshard_after_forward: bool = True
    config: GPTConfig = field(default_factory=lambda: CONFIG)
    save_at: int | None = None  # save a sharded checkpoint after this step ...
    save_to: str | None = None  # ... to this directory
    resume_from: str | None = None


def tokens() -> torch.Tensor:
    generator = torch.Generator().manual_seed(DATA_SEED)
    return torch.randint(0, CONFIG.vocab_size, (SAMPLES, CONFIG.seq_len + 1), generator=generator)


def build(run: Run) -> torch.nn.Module:
    with torch.device("meta"):
        model = GPT(run.config)
    if run.checkpointing:
        apply_activation_checkpointing(model)
    if run.mode == "fsdp":
        shard_model(
            model, precision=run.precision, cpu_offload=run.cpu_offload, reshard_after_forward=run.reshard_after_forward
        )
    materialize(model, "cpu", seed=MODEL_SEED, init_fn=gpt_init_fn(model))
    return DistributedDataParallel(model) if run.mode == "ddp" else model


def _sync(model: torch.nn.Module, run: Run, last: bool):
    """Gradients are reduced only on the last micro-batch of a step."""
    if run.mode == "ddp" and not last:
        return model.no_sync()
    if run.mode == "fsdp":
        model.set_requires_gradient_sync(last)
    return contextlib.nullcontext()


def _step(model, optimizer, sampler, data, run: Run) -> float:
    total = 0.0
    for micro in range(run.accumulation):
        batch = data[sampler.sample_indices()[: run.batch_size]]
        sampler.advance(run.batch_size)
        with _sync(model, run, micro == run.accumulation - 1):
            logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
            (loss / run.accumulation).backward()
        total += loss.item()
    clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
    mean = torch.tensor([total / run.accumulation])
    if cdist.is_initialized():
        cdist.all_reduce(mean)
        mean /= cdist.world_size()
    return mean.item()


def local_bytes(model, optimizer) -> tuple[int, int]:
    """This rank's parameter and optimizer-state bytes (the local shards only)."""

    def size(t: torch.Tensor) -> int:
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    params = sum(size(p) for p in {id(p): p for p in model.parameters()}.values())
    state = sum(
        size(v) for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0
    )
    return params, state


def full_weights(model) -> dict[str, torch.Tensor]:
    """Every rank's full, unsharded weights (collective for a sharded model)."""
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
    inner = model.module if isinstance(model, DistributedDataParallel) else model
    state = get_model_state_dict(inner, options=options)
    return {k: v.detach().clone().float() for k, v in state.items()}


def train(rank: int, world_size: int, run: Run) -> dict[str, Any]:
    """Train `run.steps` optimizer steps (counted from the checkpoint, if resuming); report."""
    torch.manual_seed(1000 + rank)  # the model's values must not depend on it
    model = build(run)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, foreach=False)
    sampler = DistributedSampler(SAMPLES, num_replicas=world_size, rank=rank, seed=SAMPLER_SEED)
    data, losses, start = tokens(), [], 0
    initial = full_weights(model)
    if run.resume_from is not None:
        start = load_sharded(run.resume_from, model=model, optimizer=optimizer, sampler=sampler)["step"]
    for step in range(start + 1, run.steps + 1):
        losses.append(_step(model, optimizer, sampler, data, run))
        if step == run.save_at:
            save_sharded(
                f"{run.save_to}/step_{step:08d}.dcp",
                model=model,
                optimizer=optimizer,
                sampler=sampler,
                state={"step": step},
            )
    params, state = local_bytes(model, optimizer)
    return {
        "losses": losses,
        "weights": full_weights(model),
        "initial": initial,
        "param_bytes": params,
        "state_bytes": state,
    }


def train_each(rank: int, world_size: int, runs: list[Run]) -> list[dict[str, Any]]:
    """Several runs one after the other in the same ranks (one launch for many checks)."""
    return [train(rank, world_size, run) for run in runs]


def single(run: Run) -> dict[str, Any]:
    """The one-process reference, in the calling process (no process group)."""
    return train(0, 1, replace(run, mode="single"))
