"""Addition problems such as `123+456=579` as byte tokens, for the GPT.

Each sample is the ASCII string `a+b=c` followed by a newline (end of answer), padded
with byte 0 to `seq_len + 1` tokens. The model reads tokens `[0, seq_len)` and predicts
`[1, seq_len]`; only the answer's digits and its newline count in the loss.

Exact match is computed teacher-forced: a sample counts as correct when the argmax at
every answer position equals the target. Because the newline is part of the answer, this
is the same as greedy decoding from `a+b=` reproducing `c` and stopping (each greedy step
would see exactly the correct prefix), at the cost of one forward pass.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Iterator

import numpy as np
import torch
from torch import nn

from clorch.data.base import (
    TaskSizes,
    as_index,
    check_fraction,
    check_positive_int,
    check_seed,
    check_split,
    count_like,
    derive_seed,
    generator,
    sizes_of,
)
from clorch.data.text import VOCAB_SIZE, lm_per_sample_loss

_TRAIN, _EVAL, _SPLIT_HASH = 1, 2, 3
PAD, PLUS, EQUALS, END, ZERO = 0, ord("+"), ord("="), ord("\n"), ord("0")
MAX_DIGITS = 9  # a + b stays well inside int64 and the sample count stays drawable
_MAX_ROUNDS = 100


def min_seq_len(digits: int) -> int:
    """Model input length that holds the longest sample: `d + 1 + d + 1 + (d + 1) + 1 - 1`."""
    return 3 * digits + 3


def _in_eval_split(a: torch.Tensor, b: torch.Tensor, digits: int, seed: int, eval_fraction: float) -> torch.Tensor:
    """Whether each pair (a, b) belongs to the eval split: a seeded splitmix64 hash of the pair."""
    key = np.uint64(derive_seed(seed, _SPLIT_HASH))
    x = (a.numpy().astype(np.uint64) * np.uint64(10**digits) + b.numpy().astype(np.uint64)) ^ key
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps on purpose
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    uniform = (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return torch.from_numpy(uniform < eval_fraction)


def _rounds(
    count: int, digits: int, split: str, seed: int, eval_fraction: float
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Rejection rounds for `count` pairs of this split: `(a, b, keep)` per round.

    The caller stops once it has kept `count` pairs; a caller still asking after
    `_MAX_ROUNDS` rounds gets the ValueError saying the split is (nearly) empty.
    """
    stream = generator(seed, _TRAIN if split == "train" else _EVAL)
    share = eval_fraction if split == "eval" else 1.0 - eval_fraction
    per_round = max(4096, math.ceil(1.2 * count / share))
    for _ in range(_MAX_ROUNDS):
        a = torch.randint(0, 10**digits, (per_round,), generator=stream)
        b = torch.randint(0, 10**digits, (per_round,), generator=stream)
        yield a, b, _in_eval_split(a, b, digits, seed, eval_fraction) == (split == "eval")
    raise ValueError(
        f"arithmetic: could not draw {count} {split} pairs with digits={digits}, "
        f"eval_fraction={eval_fraction}: the {split} split of the {10 ** (2 * digits)} pairs "
        f"is (nearly) empty; raise digits or change eval_fraction"
    )


def _draw_pairs(
    count: int, digits: int, split: str, seed: int, eval_fraction: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` pairs of this split, drawn uniformly (with replacement) by rejection."""
    found_a, found_b, found = [], [], 0
    for a, b, keep in _rounds(count, digits, split, seed, eval_fraction):
        found_a.append(a[keep])
        found_b.append(b[keep])
        found += int(keep.sum())
        if found >= count:
            break
    return torch.cat(found_a)[:count], torch.cat(found_b)[:count]


def _check_drawable(count: int, digits: int, split: str, seed: int, eval_fraction: float) -> None:
    """Raise the ValueError `_draw_pairs` raises, if it does, keeping no pairs.

    Whether the draw fails depends on how many of the pairs the seeded hash gives this
    split, which no formula tells, so this replays the same rounds; it costs the random
    integers and their hashes (usually one round), not the token tensors.
    """
    found = 0
    for _, _, keep in _rounds(count, digits, split, seed, eval_fraction):
        found += int(keep.sum())
        if found >= count:
            return


def _check_arguments(
    sample_count: object, digits: object, seq_len: object, eval_fraction: object, split: object, seed: object
) -> int:
    """The model input length (`seq_len`, or the shortest that fits when None).

    Raises:
        ValueError: the first bad argument, in the order the constructor checks them.
    """
    check_positive_int("arithmetic", "sample_count", sample_count)
    check_positive_int("arithmetic", "digits", digits)
    if digits > MAX_DIGITS:
        raise ValueError(f"arithmetic.digits must be <= {MAX_DIGITS}, got {digits}")
    need = min_seq_len(digits)
    seq_len = need if seq_len is None else seq_len
    check_positive_int("arithmetic", "seq_len", seq_len)
    if seq_len < need:
        raise ValueError(f"arithmetic.seq_len must be >= {need} for digits={digits} (3 * digits + 3), got {seq_len}")
    check_fraction("arithmetic", "eval_fraction", eval_fraction)
    check_split("arithmetic", split)
    check_seed("arithmetic", seed)
    return seq_len


def _digit_columns(x: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Digits of each x, most significant first, in `width` columns, and which are not leading zeros."""
    powers = 10 ** torch.arange(width - 1, -1, -1)
    column = x.unsqueeze(1)
    return (column // powers) % 10 + ZERO, (column >= powers) | (powers == 1)


def encode(a: torch.Tensor, b: torch.Tensor, digits: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens `(N, width)` of `a+b=c\\n` padded with PAD, and which tokens are the answer.

    Each number is laid out in fixed columns, then a stable sort per row moves the real
    characters to the front in order, so no Python runs per sample.
    """
    n = a.numel()
    one = lambda value: torch.full((n, 1), value, dtype=torch.long)  # noqa: E731
    yes, no = torch.ones(n, 1, dtype=torch.bool), torch.zeros(n, 1, dtype=torch.bool)
    (da, va), (db, vb), (dc, vc) = (
        _digit_columns(a, digits),
        _digit_columns(b, digits),
        _digit_columns(a + b, digits + 1),
    )
    chars = torch.cat([da, one(PLUS), db, one(EQUALS), dc, one(END)], dim=1)
    valid = torch.cat([va, yes, vb, yes, vc, yes], dim=1)
    answer = torch.cat([torch.zeros_like(va), no, torch.zeros_like(vb), no, vc, yes], dim=1)
    order = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)
    valid = valid.gather(1, order)
    chars = chars.gather(1, order).masked_fill(~valid, PAD)
    answer = answer.gather(1, order) & valid
    pad = width - chars.size(1)
    chars = torch.cat([chars, torch.full((n, pad), PAD, dtype=torch.long)], dim=1)
    answer = torch.cat([answer, torch.zeros(n, pad, dtype=torch.bool)], dim=1)
    return chars, answer


def decode(tokens: torch.Tensor) -> str:
    """One row of tokens as text, padding dropped (for messages and tests)."""
    return bytes(int(t) for t in tokens if int(t) != PAD).decode("ascii")


class ArithmeticTask:
    """Addition of two non-negative numbers of up to `digits` digits.

    The space of pairs (a, b) is split by a seeded hash: a pair is in the eval split with
    probability `eval_fraction`, so for a seed the two splits never share a problem. Each
    split draws `sample_count` pairs of its own with replacement.

    Args:
        sample_count: samples in this split.
        digits: most digits per operand, 1 to 9.
        seq_len: model input length; None for the shortest that fits, `3 * digits + 3`.
        eval_fraction: share of all pairs held out for eval, in (0, 1).
        split: "train" or "eval".
        seed: picks the split of the pairs and the samples.

    Raises:
        ValueError: a bad argument value, or a `seq_len` too short for `digits`.
    """

    compile_loss: bool | str = False  # with `compile: true` the engine sets its compile_mode here

    ARGUMENTS = ("sample_count", "digits", "seq_len", "eval_fraction")

    def __init__(
        self,
        sample_count: int = 2048,
        digits: int = 3,
        seq_len: int | None = None,
        eval_fraction: float = 0.1,
        *,
        split: str = "train",
        seed: int = 0,
    ) -> None:
        seq_len = _check_arguments(sample_count, digits, seq_len, eval_fraction, split, seed)
        self.split, self.seed, self.digits, self.seq_len = split, seed, digits, seq_len
        self.tokens_per_sample = seq_len
        self.a, self.b = _draw_pairs(sample_count, digits, split, seed, float(eval_fraction))
        tokens, answer = encode(self.a, self.b, digits, seq_len + 1)
        self.tokens = tokens.to(torch.uint8)  # bytes: a quarter of the memory, widened per batch
        self.answer_mask = answer[:, 1:].contiguous()  # aligned with the targets

    @sizes_of(__init__)
    def sizes(cls, a: SimpleNamespace) -> TaskSizes:
        """`len` and `model_kwargs()` of the split these arguments build, without building it.

        Takes the constructor's arguments and raises what it raises. The length is always
        `sample_count`, but telling whether the draw fails replays its random pairs (see
        `_check_drawable`); no tokens are built.
        """
        seq_len = _check_arguments(a.sample_count, a.digits, a.seq_len, a.eval_fraction, a.split, a.seed)
        _check_drawable(a.sample_count, a.digits, a.split, a.seed, float(a.eval_fraction))
        return TaskSizes(a.sample_count, {"vocab_size": VOCAB_SIZE, "seq_len": seq_len})

    def __len__(self) -> int:
        return self.tokens.size(0)

    def batch(self, indices: torch.Tensor | list[int]) -> dict[str, torch.Tensor]:
        """`{"input", "target"}` int64 `(B, seq_len)` and `"mask"` bool `(B, seq_len)` (answer targets)."""
        idx = as_index(indices, self.tokens.device, len(self))
        rows = self.tokens[idx].long()
        return {"input": rows[:, :-1].contiguous(), "target": rows[:, 1:].contiguous(), "mask": self.answer_mask[idx]}

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Cross-entropy on the answer tokens: per-sample mean, then mean over the batch."""
        logits = model(batch["input"])
        return lm_per_sample_loss(logits, batch["target"], batch["mask"], compiled=self.compile_loss).mean()

    @torch.no_grad()
    def eval_sums(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`loss_sum`, `exact_sum` (answers right in full) and `count`, 0-d float64."""
        logits = model(batch["input"])
        mask = batch["mask"]
        per_sample = lm_per_sample_loss(logits, batch["target"], mask)
        exact = ((logits.argmax(dim=-1) == batch["target"]) | ~mask).all(dim=1)
        return {
            "loss_sum": per_sample.sum(dtype=torch.float64),
            "exact_sum": exact.sum(dtype=torch.float64),
            "count": count_like(per_sample),
        }

    def model_kwargs(self) -> dict:
        """What the GPT must match: `vocab_size` (256 bytes) and `seq_len`."""
        return {"vocab_size": VOCAB_SIZE, "seq_len": self.seq_len}
