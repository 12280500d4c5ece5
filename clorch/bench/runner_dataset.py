"""`clorch-bench runner --data dataset`: the same token windows as a map-style torch Dataset.

The windows are read from a token file as nanoGPT's `prepare.py` writes one (uint16 token
ids, no header), through a memory map, as a user's own Dataset over such a file does. Both loops
read `(input, target)` items through torch's `DataLoader` with the same settings
(`--num-workers`, pinned memory on CUDA, persistent workers with workers): the plain loop
with a shuffling DataLoader as a user writes one, clorch through `data._target_`'s path
(`clorch.data.user.DatasetTask`, fed by clorch's DistributedSampler). So the ratio
measures what clorch adds to a user's own dataset, not the data path's speed.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import clorch.distributed as cd
from clorch.data.user import DatasetTask
from clorch.train.components import compile_mode_arg
from clorch.optim import build_optimizer


class TokenWindows(Dataset):
    """Item i is window i of a uint16 token file: (tokens[i*w : i*w + w-1], the same shifted by one),
    w = seq_len + 1, read through a memory map."""

    def __init__(self, path: str | os.PathLike, seq_len: int):
        self.path, self.window = str(path), seq_len + 1
        self.tokens = np.memmap(self.path, dtype=np.uint16, mode="r")

    @classmethod
    def written(cls, data: torch.Tensor, path: str | os.PathLike) -> "TokenWindows":
        """Write `data` ((samples, seq_len + 1) token ids below 65536) as a token file; open it."""
        data.to(torch.int32).numpy().astype(np.uint16).tofile(path)
        return cls(path, data.size(1) - 1)

    @property
    def tokens_per_sample(self) -> int:
        return self.window - 1

    def __len__(self) -> int:
        return len(self.tokens) // self.window

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.window
        row = torch.from_numpy(self.tokens[start : start + self.window].astype(np.int64))
        return row[:-1], row[1:]


def lm_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, as `loss._target_` would name it for a language model."""
    return F.cross_entropy(outputs.flatten(0, 1), targets.flatten())


def loader_settings(opts: dict, device: torch.device) -> dict[str, Any]:
    workers = opts["num_workers"]
    return {"num_workers": workers, "pin_memory": device.type == "cuda", "persistent_workers": workers > 0}


def clorch_task(dataset: TokenWindows, opts: dict, device: torch.device) -> Any:
    """The dataset as clorch-train's `data._target_` path reads it."""
    task = DatasetTask(dataset, loss=lm_loss, seed=1, **loader_settings(opts, device))
    task.tokens_per_sample = dataset.tokens_per_sample
    return task


def plain_runner(model: torch.nn.Module, dataset: TokenWindows, opts: dict, device: torch.device):
    """A hand-written loop over a shuffling DataLoader: autocast, forward, loss, backward, step.

    On more than one rank it is a torch DDP script: `model` comes wrapped in torch's
    DistributedDataParallel, and batches come through torch's DistributedSampler.
    """
    compiled = torch.compile(model, mode=compile_mode_arg(opts["compile_mode"])) if opts["compile"] else model
    optimizer = build_optimizer("adamw", model.parameters(), lr=3e-4, weight_decay=0.1)
    if cd.world_size() > 1:
        sampler = DistributedSampler(dataset, shuffle=True, seed=1, drop_last=True)
        order = {"sampler": sampler}
    else:
        sampler, order = None, {"shuffle": True, "generator": torch.Generator().manual_seed(1)}
    loader = DataLoader(
        dataset, batch_size=opts["batch_size"], drop_last=True, **order, **loader_settings(opts, device)
    )
    batches, epoch = iter(loader), 0

    def run(steps: int) -> None:
        nonlocal batches, epoch
        for _ in range(steps):
            try:
                inputs, targets = next(batches)
            except StopIteration:  # a new epoch
                epoch += 1
                if sampler is not None:
                    sampler.set_epoch(epoch)
                batches = iter(loader)
                inputs, targets = next(batches)
            inputs = inputs.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = lm_loss(compiled(inputs), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return run
