"""Byte-level language modelling over any file the user names (UTF-8 text, typically)."""

from __future__ import annotations

import math
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from clorch.data.tasks import (
    as_index, check_positive_int, check_seed, check_split, count_like, generator,
)

_TRAIN, _EVAL = 1, 2
VOCAB_SIZE = 256  # one token per byte value


def lm_per_sample_loss(logits: torch.Tensor, target: torch.Tensor,
                       mask: torch.Tensor | None = None) -> torch.Tensor:
    """Next-token cross-entropy averaged over each sample's counted positions, shape (B,).

    Under autocast, cross_entropy's log-softmax runs in float32 without an explicit copy
    of the (possibly large) logits.
    """
    per_token = F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="none")
    per_token = per_token.view_as(target).float()
    if mask is None:
        return per_token.mean(dim=1)
    weights = mask.to(per_token.dtype)
    return (per_token * weights).sum(dim=1) / weights.sum(dim=1)


def _read_bytes(path: str | os.PathLike, minimum: int) -> torch.Tensor:
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ValueError(f"text.path must name a file, got {path!r}")
    if not os.path.isfile(path):
        raise ValueError(f"text.path {str(path)!r} does not exist or is not a file")
    size = os.path.getsize(path)
    if size < minimum:
        raise ValueError(
            f"text.path {str(path)!r} has {size} bytes; it needs at least {minimum} "
            f"(one window of seq_len + 1 bytes for each of the train and eval splits)"
        )
    return torch.from_numpy(np.fromfile(path, dtype=np.uint8))


class ByteTextTask:
    """Windows of `seq_len + 1` bytes: the model reads the first `seq_len`, predicts the next.

    The eval split is the file's last `eval_fraction` (at least one window); the train split
    is everything before it, so the two never share a byte. Without `sample_count` a split
    is every non-overlapping window of its region, in file order; with it, `sample_count`
    windows start at offsets drawn from a generator seeded with `seed` for that split.

    Args:
        path: the file (any bytes; UTF-8 text is the intended use).
        seq_len: model input length in bytes (tokens).
        sample_count: windows in this split; None for every non-overlapping window.
        eval_fraction: share of the file, at its end, held out for eval; in (0, 1).
        split: "train" or "eval".
        seed: picks the window offsets when `sample_count` is given.

    Raises:
        ValueError: a missing file, a file shorter than 2 * (seq_len + 1) bytes, or a bad
            argument value.
    """

    ARGUMENTS = ("path", "seq_len", "sample_count", "eval_fraction")
    default_model = "gpt"

    def __init__(self, path: str | os.PathLike, seq_len: int = 128, sample_count: int | None = None,
                 eval_fraction: float = 0.1, *, split: str = "train", seed: int = 0) -> None:
        check_positive_int("text", "seq_len", seq_len)
        if sample_count is not None:
            check_positive_int("text", "sample_count", sample_count)
        if isinstance(eval_fraction, bool) or not isinstance(eval_fraction, (int, float)) \
                or not 0.0 < eval_fraction < 1.0:
            raise ValueError(f"text.eval_fraction must be a number in (0, 1), got {eval_fraction!r}")
        check_split("text", split)
        check_seed("text", seed)
        data = _read_bytes(path, 2 * (seq_len + 1))
        size = data.numel()
        eval_bytes = max(math.ceil(size * eval_fraction), seq_len + 1)
        if size - eval_bytes < seq_len + 1:
            raise ValueError(
                f"text.path {str(path)!r} has {size} bytes; with eval_fraction={eval_fraction} "
                f"the train split keeps {size - eval_bytes}, fewer than seq_len + 1 = {seq_len + 1}"
            )
        start = 0 if split == "train" else size - eval_bytes
        # Clone the region so the file-sized buffer of the other split can be freed.
        self.data = data[start: size - eval_bytes if split == "train" else size].clone()
        self.path, self.split, self.seed, self.seq_len = str(path), split, seed, seq_len
        self.tokens_per_sample = seq_len
        last_start = self.data.numel() - seq_len - 1  # largest valid window start
        if sample_count is None:
            self.starts = torch.arange(0, last_start + 1, seq_len)
        else:
            stream = generator(seed, _TRAIN if split == "train" else _EVAL)
            self.starts = torch.randint(0, last_start + 1, (sample_count,), generator=stream)
        self._offsets = torch.arange(seq_len + 1)

    def __len__(self) -> int:
        return self.starts.numel()

    def batch(self, indices: torch.Tensor | list[int]) -> dict[str, torch.Tensor]:
        """`{"input": (B, seq_len), "target": (B, seq_len)}` int64 byte tokens, target shifted by one."""
        idx = as_index(indices)
        windows = self.data[self.starts[idx].unsqueeze(1) + self._offsets].long()
        return {"input": windows[:, :-1], "target": windows[:, 1:]}

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean next-byte cross-entropy (nats) over the batch."""
        return lm_per_sample_loss(model(batch["input"]), batch["target"]).mean()

    @torch.no_grad()
    def eval_sums(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`loss_sum` (per-window mean cross-entropy, summed) and `count`, 0-d float64."""
        per_sample = lm_per_sample_loss(model(batch["input"]), batch["target"])
        return {"loss_sum": per_sample.sum(dtype=torch.float64), "count": count_like(per_sample)}

    def model_kwargs(self) -> dict:
        """What the GPT must match: `vocab_size` (256 bytes) and `seq_len`."""
        return {"vocab_size": VOCAB_SIZE, "seq_len": self.seq_len}
