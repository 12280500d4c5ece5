"""A process that saves a checkpoint to one path again and again, without a process group.

python -m tests.checkpoint.concurrent_saver PATH SEED ROUNDS
"""

from __future__ import annotations

import sys

import torch

from clorch.checkpoint import save_checkpoint


def main(path: str, seed: int, rounds: int) -> None:
    torch.manual_seed(seed)
    model = torch.nn.Linear(64, 64)
    for step in range(rounds):
        with torch.no_grad():
            model.weight.fill_(seed * 1000 + step)
        save_checkpoint(path, model=model, state={"seed": seed, "step": step})


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
