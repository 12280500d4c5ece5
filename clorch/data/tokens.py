"""Language modelling over token files, in the formats language-model users already have.

Two layouts are read, both through a memory map (the file is never loaded whole):

* nanoGPT's `prepare.py` output: a flat array of token ids, no header (`train.bin`,
  `val.bin`), `uint16` by default (`dtype="uint32"` for vocabularies above 65,536).
* llm.c's `.bin` files: a header of 256 int32 (`[0]` the magic 20240520, `[1]` the
  version 1, `[2]` the token count), then the ids as uint16.

`header="auto"` (the default) tells them apart by the magic number. A sample is a window
of `seq_len + 1` tokens: the model reads the first `seq_len` and predicts the next.
"""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import numpy as np
import torch

from clorch.data.base import (
    TaskSizes,
    as_index,
    check_fraction,
    check_positive_int,
    check_seed,
    check_split,
    generator,
    sizes_of,
)
from clorch.data.text import ByteTextTask

_TRAIN, _EVAL = 3, 4
LLMC_MAGIC, LLMC_VERSION, LLMC_HEADER_INTS = 20240520, 1, 256
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
HEADERS = ("auto", "none", "llmc")
SCAN_CHUNK = 1 << 24  # tokens read at once by the vocabulary check


def _header_bytes(path: str, header: str) -> int:
    """0 for a headerless file, 1024 for llm.c's; raises ValueError for a bad llm.c header."""
    if header == "none":
        return 0
    with open(path, "rb") as f:
        raw = f.read(4 * LLMC_HEADER_INTS)
    head = np.frombuffer(raw[: len(raw) // 4 * 4], dtype=np.int32)
    if head.size < LLMC_HEADER_INTS or head[0] != LLMC_MAGIC:
        if header == "llmc":
            raise ValueError(f"tokens: {path!r} has no llm.c header (magic {LLMC_MAGIC} in its first int32)")
        return 0
    if head[1] != LLMC_VERSION:
        raise ValueError(
            f"tokens: {path!r} is llm.c version {int(head[1])}; version {LLMC_VERSION} (uint16 tokens) is read"
        )
    size = os.path.getsize(path) - 4 * LLMC_HEADER_INTS
    if size != 2 * int(head[2]):
        raise ValueError(
            f"tokens: {path!r}: its llm.c header counts {int(head[2])} tokens, but the file "
            f"holds {size} bytes after the header ({size / 2:g} uint16 tokens)"
        )
    return 4 * LLMC_HEADER_INTS


def token_count(path: object, dtype: str, header: str, key: str) -> tuple[int, int, np.dtype]:
    """(tokens, header bytes, numpy dtype) of a token file, from one stat and its header.

    Raises:
        ValueError: a missing file, a bad dtype or header, or a size that is not a whole
            number of tokens.
    """
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ValueError(f"data.{key} must name a token file, got {path!r}")
    path = str(path)
    if not os.path.isfile(path):
        raise ValueError(f"data.{key}={path!r} does not exist or is not a file")
    if dtype not in DTYPES:
        raise ValueError(f"data.dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if header not in HEADERS:
        raise ValueError(f"data.header must be one of {', '.join(HEADERS)}, got {header!r}")
    offset = _header_bytes(path, header)
    np_dtype = np.dtype(np.uint16 if offset else DTYPES[dtype])
    size = os.path.getsize(path) - offset
    if size % np_dtype.itemsize:
        raise ValueError(
            f"data.{key}={path!r} holds {size} bytes, not a whole number of {np_dtype.name} "
            f"tokens ({np_dtype.itemsize} bytes each): is data.dtype right?"
        )
    return size // np_dtype.itemsize, offset, np_dtype


def largest_token(path: str, dtype: str = "uint16", header: str = "auto") -> int:
    """The largest id in a token file (read in chunks through the memory map)."""
    count, offset, np_dtype = token_count(path, dtype, header, "path")
    ids = np.memmap(path, dtype=np_dtype, mode="r", offset=offset, shape=(count,))
    return max(int(ids[i : i + SCAN_CHUNK].max()) for i in range(0, count, SCAN_CHUNK)) if count else -1


def _check_arguments(
    seq_len: object, vocab_size: object, sample_count: object, eval_fraction: object, split: object, seed: object
) -> None:
    check_positive_int("tokens", "seq_len", seq_len)
    check_positive_int("tokens", "vocab_size", vocab_size)
    if sample_count is not None:
        check_positive_int("tokens", "sample_count", sample_count)
    check_fraction("tokens", "eval_fraction", eval_fraction)
    check_split("tokens", split)
    check_seed("tokens", seed)


def _region(
    train_path: str, eval_path: str | None, dtype: str, header: str, seq_len: int, eval_fraction: float, split: str
) -> tuple[str, int, int, int, np.dtype]:
    """(file, header bytes, first token, end token) of the tokens `split` reads."""
    if eval_path is not None and split == "eval":
        path, key = eval_path, "eval_path"
    else:
        path, key = train_path, "train_path"
    count, offset, np_dtype = token_count(path, dtype, header, key)
    window = seq_len + 1
    if eval_path is not None:
        if count < window:
            raise ValueError(
                f"data.{key}={str(path)!r} holds {count} tokens, fewer than one window of seq_len + 1 = {window}"
            )
        return str(path), offset, 0, count, np_dtype
    held = max(math.ceil(count * eval_fraction), window)
    if count - held < window:
        raise ValueError(
            f"data.train_path={str(path)!r} holds {count} tokens; with eval_fraction="
            f"{eval_fraction} (no data.eval_path) the train split keeps {count - held}, "
            f"fewer than seq_len + 1 = {window}"
        )
    start, stop = (0, count - held) if split == "train" else (count - held, count)
    return str(path), offset, start, stop, np_dtype


class TokenFileTask:
    """Windows of `seq_len + 1` tokens from a token file; the eval split from its own file.

    Without `eval_path` the last `eval_fraction` of the train file is held out, so the two
    never share a token. Without `sample_count` a split is every non-overlapping window of
    its tokens, in file order; with it, `sample_count` windows start at offsets drawn from
    a generator seeded with `seed` for that split. Either way a sample is fixed by its
    index, so a sampler's resume position names the same windows again.

    Args:
        train_path: the training tokens (nanoGPT's train.bin, or an llm.c .bin).
        eval_path: the held-out tokens (val.bin); None holds out the train file's tail.
        seq_len: model input length in tokens.
        vocab_size: the model's vocabulary; every id must be below it (GPT-2's 50257).
        dtype: "uint16" or "uint32" for headerless files (llm.c's are uint16).
        header: "auto" (llm.c's when its magic is there), "none" or "llmc".
        sample_count: windows in this split; None for every non-overlapping window.
        eval_fraction: share of the train file held out when there is no eval_path.
        split: "train" or "eval".
        seed: picks the window offsets when `sample_count` is given.

    Raises:
        ValueError: a missing file, a size that does not fit the dtype or the header, a split
            shorter than one window, or a bad argument value.
    """

    compile_loss: bool | str = False  # with `compile: true` the engine sets its compile_mode here

    ARGUMENTS = ("train_path", "eval_path", "seq_len", "vocab_size", "dtype", "header", "sample_count", "eval_fraction")

    def __init__(
        self,
        train_path: str | os.PathLike,
        eval_path: str | os.PathLike | None = None,
        seq_len: int = 256,
        vocab_size: int = 50257,
        dtype: str = "uint16",
        header: str = "auto",
        sample_count: int | None = None,
        eval_fraction: float = 0.1,
        *,
        split: str = "train",
        seed: int = 0,
    ) -> None:
        _check_arguments(seq_len, vocab_size, sample_count, eval_fraction, split, seed)
        path, offset, start, stop, np_dtype = _region(
            str(train_path), eval_path and str(eval_path), dtype, header, seq_len, eval_fraction, split
        )
        self.tokens = np.memmap(path, dtype=np_dtype, mode="r", offset=offset)[start:stop]
        self.split, self.seq_len, self.vocab_size = split, seq_len, vocab_size
        self.tokens_per_sample = seq_len
        last_start = stop - start - seq_len - 1
        # numpy, not tensors: the windows are read from the memory map on the host (a token file
        # is often larger than a GPU), so nothing here is moved to the device with the task.
        if sample_count is None:
            self.starts = np.arange(0, last_start + 1, seq_len)
        else:
            stream = generator(seed, _TRAIN if split == "train" else _EVAL)
            self.starts = torch.randint(0, last_start + 1, (sample_count,), generator=stream).numpy()
        self._offsets = np.arange(seq_len + 1)

    @sizes_of(__init__)
    def sizes(cls, a: SimpleNamespace) -> TaskSizes:
        """`len` and `model_kwargs()` of the split these arguments build, without building it
        (one stat and the header of its file)."""
        seq_len, sample_count = a.seq_len, a.sample_count
        _check_arguments(seq_len, a.vocab_size, sample_count, a.eval_fraction, a.split, a.seed)
        _, _, start, stop, _ = _region(
            str(a.train_path), a.eval_path and str(a.eval_path), a.dtype, a.header, seq_len, a.eval_fraction, a.split
        )
        if sample_count is None:
            sample_count = (stop - start - seq_len - 1) // seq_len + 1
        return TaskSizes(sample_count, {"vocab_size": a.vocab_size, "seq_len": seq_len})

    def __len__(self) -> int:
        return len(self.starts)

    def batch(self, indices: torch.Tensor | list[int]) -> dict[str, torch.Tensor]:
        """`{"input": (B, seq_len), "target": (B, seq_len)}` int64 token ids, target shifted by one."""
        idx = as_index(indices, None, len(self)).cpu().numpy()
        rows = self.starts[idx][:, None] + self._offsets  # reads only these windows
        windows = torch.from_numpy(self.tokens[rows].astype(np.int64))
        # contiguous copies, not views of the windows: a model's own loss may `targets.view(-1)`
        return {"input": windows[:, :-1].contiguous(), "target": windows[:, 1:].contiguous()}

    # Next-token cross-entropy, in training and summed for an exact eval: the byte-level task's own.
    loss = ByteTextTask.loss
    eval_sums = ByteTextTask.eval_sums

    @staticmethod
    def derived_metrics(metrics: dict[str, float]) -> dict[str, float]:
        """Perplexity, exp(eval loss): computed from the exact mean, never averaged itself."""
        return {"perplexity": math.exp(min(metrics["loss"], 700.0))}

    def model_kwargs(self) -> dict:
        """What the GPT must match: `vocab_size` and `seq_len`."""
        return {"vocab_size": self.vocab_size, "seq_len": self.seq_len}
