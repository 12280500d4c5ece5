"""The workloads `clorch-bench ddp` trains: an MLP on random regression data, or a GPT on random tokens.

A `Workload` holds one rank's base model (each candidate trains a deep copy),
its fixed batch, the loss of a model on that batch, and how to build the
optimizer. The GPT presets and the random-token task are `clorch-bench
runner`'s (`clorch.bench.runner.PRESETS`, `clorch.bench.runner_tokens.RandomTokens`), so both benchmarks
time the same GPT-2-small step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from clorch.bench.runner import PRESETS
from clorch.bench.runner_tokens import RandomTokens
from clorch.models import GPT, GPTConfig
from clorch.optim import build_optimizer

# --model choice -> clorch.bench.runner.PRESETS key ("mlp" has no preset).
GPT_MODELS = {"gpt2-small": "gpt2-small", "gpt-tiny": "tiny"}
MODELS = ("mlp", *GPT_MODELS)
DEFAULT_BATCH = {"mlp": 64, "gpt2-small": 8, "gpt-tiny": 8}  # rows (MLP) or sequences (GPT) per rank


@dataclass
class Workload:
    """What one rank trains; the candidates differ only in how gradients are reduced."""

    model: torch.nn.Module  # base model on the rank's device; candidates deep-copy it
    loss: Callable[[torch.nn.Module], torch.Tensor]  # a model's loss on this rank's fixed batch
    optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer]  # a fresh optimizer for a model
    description: str  # model, size, per-rank batch, precision and optimizer, for the table title
    tokens_per_step: int | None  # tokens per rank per step (GPT), None for the MLP


def default_batch(model: str) -> int:
    """The per-rank batch `--batch` stands for when left out: 64 rows (MLP) or 8 sequences (GPT)."""
    return DEFAULT_BATCH[model]


def build(args: dict, rank: int, device: torch.device) -> Workload:
    """This rank's workload; every rank builds the same model (seed 0) and its own batch (seed 100 + rank)."""
    if args["model"] == "mlp":
        return _mlp_workload(args, rank, device)
    if args["model"] in GPT_MODELS:
        return _gpt_workload(args, rank, device)
    raise ValueError(f"--model must be one of {', '.join(MODELS)}, got {args['model']!r}")


def _mlp_workload(args: dict, rank: int, device: torch.device) -> Workload:
    torch.manual_seed(0)
    f, w = args["features"], args["width"]
    model = torch.nn.Sequential(
        torch.nn.Linear(f, w),
        torch.nn.ReLU(),
        torch.nn.Linear(w, w // 2),
        torch.nn.ReLU(),
        torch.nn.Linear(w // 2, w),
        torch.nn.ReLU(),
        torch.nn.Linear(w, f),
    ).to(device)
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(args["batch"], f, generator=gen).to(device)
    y = torch.randn(args["batch"], f, generator=gen).to(device)
    params = sum(p.numel() for p in model.parameters())
    return Workload(
        model=model,
        loss=lambda m: torch.nn.functional.mse_loss(m(x), y),
        optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=1e-4),
        description=f"MLP {params / 1e6:.1f}M params, batch {args['batch']}/rank",
        tokens_per_step=None,
    )


def _gpt_workload(args: dict, rank: int, device: torch.device) -> Workload:
    config = GPTConfig(**PRESETS[GPT_MODELS[args["model"]]])
    torch.manual_seed(0)
    model = GPT(config).to(device)
    task = RandomTokens(args["batch"], config.seq_len, config.vocab_size, seed=100 + rank)
    batch = {k: v.to(device) for k, v in task.batch(range(args["batch"])).items()}

    def loss(m: torch.nn.Module) -> torch.Tensor:
        # Autocast covers forward and loss only; backward runs outside it, as in clorch's loop.
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return task.loss(m, batch)

    # build_optimizer picks the fused AdamW kernel when every parameter is on CUDA.
    fused = device.type == "cuda"
    return Workload(
        model=model,
        loss=loss,
        optimizer=lambda m: build_optimizer("adamw", m.parameters(), lr=3e-4, weight_decay=0.1),
        description=(
            f"{args['model']} {model.num_parameters() / 1e6:.1f}M params, "
            f"batch {args['batch']}x{config.seq_len} tokens/rank, bf16 autocast, "
            f"{'fused ' if fused else ''}AdamW"
        ),
        tokens_per_step=args["batch"] * config.seq_len,
    )
