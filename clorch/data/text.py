"""Byte-level language modelling over any file the user names (UTF-8 text, typically)."""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from clorch.data.base import (
    TaskSizes,
    as_index,
    check_fraction,
    check_positive_int,
    check_seed,
    check_split,
    count_like,
    generator,
    sizes_of,
)

_TRAIN, _EVAL = 1, 2
VOCAB_SIZE = 256  # one token per byte value


def lm_per_sample_loss(
    logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None = None, compiled: bool | str = False
) -> torch.Tensor:
    """Next-token cross-entropy averaged over each sample's counted positions, shape (B,).

    Under autocast, cross_entropy's log-softmax runs in float32 without an explicit copy
    of the (possibly large) logits. `compiled` True or a torch.compile mode name (the
    engine's `compile: true` and `compile_mode`) runs it through torch.compile, which
    fuses the float32 log-softmax into the reductions, so the float32 logits (and their
    gradient) are never written out in full.
    """
    if compiled:
        return _compiled_loss("default" if compiled is True else compiled)(logits, target, mask)
    return _lm_per_sample_loss(logits, target, mask)


_COMPILED_LOSS: dict = {}


def _compiled_loss(mode: str):
    if mode not in _COMPILED_LOSS:
        _COMPILED_LOSS[mode] = torch.compile(_lm_per_sample_loss, mode=None if mode == "default" else mode)
    return _COMPILED_LOSS[mode]


def _lm_per_sample_loss(logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    per_token = F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="none")
    per_token = per_token.view_as(target).float()
    if mask is None:
        return per_token.mean(dim=1)
    weights = mask.to(per_token.dtype)
    return (per_token * weights).sum(dim=1) / weights.sum(dim=1)


def _check_arguments(seq_len: object, sample_count: object, eval_fraction: object, split: object, seed: object) -> None:
    """Raise ValueError for the first bad argument other than `path`, in the constructor's order."""
    check_positive_int("text", "seq_len", seq_len)
    if sample_count is not None:
        check_positive_int("text", "sample_count", sample_count)
    check_fraction("text", "eval_fraction", eval_fraction)
    check_split("text", split)
    check_seed("text", seed)


def _file_size(path: object, minimum: int) -> int:
    """The size in bytes (one stat) of the file at `path`, which must hold `minimum` bytes."""
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
    return size


def _region(path: str | os.PathLike, size: int, seq_len: int, eval_fraction: float, split: str) -> tuple[int, int]:
    """`[start, stop)`, the bytes of a `size`-byte file that `split` owns.

    Raises:
        ValueError: the train split would be shorter than one window.
    """
    eval_bytes = max(math.ceil(size * eval_fraction), seq_len + 1)
    if size - eval_bytes < seq_len + 1:
        raise ValueError(
            f"text.path {str(path)!r} has {size} bytes; with eval_fraction={eval_fraction} "
            f"the train split keeps {size - eval_bytes}, fewer than seq_len + 1 = {seq_len + 1}"
        )
    return (0, size - eval_bytes) if split == "train" else (size - eval_bytes, size)


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

    compile_loss: bool | str = False  # with `compile: true` the engine sets its compile_mode here

    ARGUMENTS = ("path", "seq_len", "sample_count", "eval_fraction")

    def __init__(
        self,
        path: str | os.PathLike,
        seq_len: int = 128,
        sample_count: int | None = None,
        eval_fraction: float = 0.1,
        *,
        split: str = "train",
        seed: int = 0,
    ) -> None:
        _check_arguments(seq_len, sample_count, eval_fraction, split, seed)
        _file_size(path, 2 * (seq_len + 1))
        data = torch.from_numpy(np.fromfile(path, dtype=np.uint8))
        start, stop = _region(path, data.numel(), seq_len, eval_fraction, split)
        # Clone the region so the file-sized buffer of the other split can be freed.
        self.data = data[start:stop].clone()
        self.path, self.split, self.seed, self.seq_len = str(path), split, seed, seq_len
        self.tokens_per_sample = seq_len
        last_start = self.data.numel() - seq_len - 1  # largest valid window start
        if sample_count is None:
            self.starts = torch.arange(0, last_start + 1, seq_len)
        else:
            stream = generator(seed, _TRAIN if split == "train" else _EVAL)
            self.starts = torch.randint(0, last_start + 1, (sample_count,), generator=stream)
        self._offsets = torch.arange(seq_len + 1)

    @sizes_of(__init__)
    def sizes(cls, a: SimpleNamespace) -> TaskSizes:
        """`len` and `model_kwargs()` of the split these arguments build, without building it.

        Takes the constructor's arguments and raises what it raises; it stats the file
        instead of reading it.
        """
        seq_len, sample_count = a.seq_len, a.sample_count
        _check_arguments(seq_len, sample_count, a.eval_fraction, a.split, a.seed)
        size = _file_size(a.path, 2 * (seq_len + 1))
        start, stop = _region(a.path, size, seq_len, a.eval_fraction, a.split)
        if sample_count is None:  # len(range(0, last_start + 1, seq_len)), last_start >= 0
            sample_count = (stop - start - seq_len - 1) // seq_len + 1
        return TaskSizes(sample_count, {"vocab_size": VOCAB_SIZE, "seq_len": seq_len})

    def __len__(self) -> int:
        return self.starts.numel()

    def batch(self, indices: torch.Tensor | list[int]) -> dict[str, torch.Tensor]:
        """`{"input": (B, seq_len), "target": (B, seq_len)}` int64 byte tokens, target shifted by one."""
        idx = as_index(indices, self.starts.device, len(self))
        windows = self.data[self.starts[idx].unsqueeze(1) + self._offsets].long()
        return {"input": windows[:, :-1].contiguous(), "target": windows[:, 1:].contiguous()}  # see tokens.py

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean next-byte cross-entropy (nats) over the batch."""
        return lm_per_sample_loss(model(batch["input"]), batch["target"], compiled=self.compile_loss).mean()

    @torch.no_grad()
    def eval_sums(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`loss_sum` (per-window mean cross-entropy, summed) and `count`, 0-d float64."""
        per_sample = lm_per_sample_loss(model(batch["input"]), batch["target"])
        return {"loss_sum": per_sample.sum(dtype=torch.float64), "count": count_like(per_sample)}

    def model_kwargs(self) -> dict:
        """What the GPT must match: `vocab_size` (256 bytes) and `seq_len`."""
        return {"vocab_size": VOCAB_SIZE, "seq_len": self.seq_len}
