"""Variable-length token sequences, the collate functions that pad them and models that read the padding.

Named by `data._target_=tests.data.varlen.Lengths`, `data.collate_fn._target_=tests.data.varlen.pad`
(or `pad_hf`) and `model._target_=tests.data.varlen.MeanPool` (or `PooledClassifier`), with
CLORCH_TRUSTED_MODULES=tests. The label of a sequence is its first token's parity, and the
lengths vary from 2 to 9: default_collate cannot stack them.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset

PAD = 0


class Lengths(Dataset):
    """`sample_count` sequences of token ids in [1, vocab_size), each of its own length."""

    def __init__(self, sample_count: int = 64, vocab_size: int = 16, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        lengths = torch.randint(2, 10, (sample_count,), generator=generator)
        self.items = [torch.randint(1, vocab_size, (int(n),), generator=generator) for n in lengths]
        self.vocab_size = vocab_size

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        tokens = self.items[i]
        return tokens, int(tokens[0]) % 2

    def model_kwargs(self) -> dict:
        return {"vocab_size": self.vocab_size, "classes": 2}


def _padded(items: list) -> torch.Tensor:
    return nn.utils.rnn.pad_sequence([tokens for tokens, _ in items], batch_first=True, padding_value=PAD)


def pad(items: list) -> dict[str, torch.Tensor]:
    """{"input": the sequences padded with PAD to the longest, "target": the labels}."""
    return {"input": _padded(items), "target": torch.tensor([label for _, label in items])}


def pad_hf(items: list) -> dict[str, torch.Tensor]:
    """Hugging Face's keys: input_ids, attention_mask and labels, for `model(**batch)`."""
    ids = _padded(items)
    return {"input_ids": ids, "attention_mask": (ids != PAD).long(), "labels": torch.tensor([y for _, y in items])}


class MeanPool(nn.Module):
    """Embeds the tokens, averages those that are not padding and classifies the mean."""

    def __init__(self, vocab_size: int, classes: int, width: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width, padding_idx=PAD)
        self.head = nn.Linear(width, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        keep = (ids != PAD).unsqueeze(-1).float()
        return self.head((self.embed(ids) * keep).sum(1) / keep.sum(1))


class PooledClassifier(MeanPool):
    """Hugging Face's calling convention: forward(input_ids, attention_mask, labels) returning a
    SequenceClassifierOutput (its loss when labels are given, and its logits)."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor | None = None):
        from transformers.modeling_outputs import SequenceClassifierOutput

        keep = attention_mask.unsqueeze(-1).float()
        logits = self.head((self.embed(input_ids) * keep).sum(1) / keep.sum(1))
        loss = None if labels is None else nn.functional.cross_entropy(logits, labels)
        return SequenceClassifierOutput(loss=loss, logits=logits)
