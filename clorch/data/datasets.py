"""Small map-style datasets that generate their data: for trying `data._target_` and for tests.

    clorch-train data._target_=clorch.data.datasets.Blobs loss=cross_entropy

They are ordinary `torch.utils.data.Dataset`s (items are `(input, target)` pairs),
as a dataset of your own would be.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from clorch.data.base import check_positive_int, check_seed, generator


class Blobs(Dataset):
    """Classification of Gaussian blobs: `classes` centres in `features` dimensions.

    Item i is `(x, label)`: x a float32 vector of `features`, label an int64 class.
    The same arguments give the same items (the centres and the samples come from `seed`).

    Args:
        sample_count: number of items.
        features: input width.
        classes: number of classes (blob centres).
        spread: standard deviation of each blob around its centre (centres are unit normal).
        seed: picks the centres and the samples.

    Raises:
        ValueError: a count below 1 or a negative seed or spread.
    """

    def __init__(
        self, sample_count: int = 512, features: int = 8, classes: int = 4, spread: float = 0.5, seed: int = 0
    ):
        for name, value in (("sample_count", sample_count), ("features", features), ("classes", classes)):
            check_positive_int("Blobs", name, value)
        check_seed("Blobs", seed)
        if not isinstance(spread, (int, float)) or isinstance(spread, bool) or spread < 0:
            raise ValueError(f"Blobs.spread must be a number >= 0, got {spread!r}")
        gen = generator(seed, 0)
        centres = torch.randn(classes, features, generator=gen)
        self.labels = torch.randint(0, classes, (sample_count,), generator=gen)
        self.inputs = centres[self.labels] + spread * torch.randn(sample_count, features, generator=gen)
        self.features, self.classes = features, classes

    def __len__(self) -> int:
        return self.labels.numel()

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.labels[index]

    def model_kwargs(self) -> dict:
        """The sizes a built-in model takes from this data (model=mlp: in and out features)."""
        return {"in_features": self.features, "out_features": self.classes}


def classification_step(
    model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor], label_smoothing: float = 0.0
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A step function as `step._target_` names one: `(loss, {"accuracy": ...})` of a batch.

    What `loss=cross_entropy` does, written out, with label smoothing as an argument
    (`step.label_smoothing=0.1`): a template for a step of your own.
    """
    inputs, labels = batch
    logits = model(inputs)
    loss = torch.nn.functional.cross_entropy(logits, labels, label_smoothing=label_smoothing)
    return loss, {"accuracy": (logits.argmax(dim=1) == labels).float().mean()}
