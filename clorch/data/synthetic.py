"""Regression against a fixed random teacher: the MLP's task, where the loss really falls."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from clorch.data.base import (
    TaskSizes,
    as_index,
    check_positive_int,
    check_seed,
    check_split,
    count_like,
    generator,
    sizes_of,
)

# Independent random streams of one seed.
_TEACHER, _TRAIN, _EVAL = 0, 1, 2


def _check_arguments(
    sample_count: object, in_features: object, out_features: object, noise: object, split: object, seed: object
) -> None:
    """Raise ValueError for the first bad argument, in the order the constructor checks them."""
    for name, value in (("sample_count", sample_count), ("in_features", in_features), ("out_features", out_features)):
        check_positive_int("synthetic", name, value)
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) or noise < 0:
        raise ValueError(f"synthetic.noise must be a number >= 0, got {noise!r}")
    check_split("synthetic", split)
    check_seed("synthetic", seed)


class SyntheticRegression:
    """Inputs x ~ N(0, I); targets y = x @ W + b + noise * N(0, I), with (W, b) fixed by seed.

    The teacher (W, b) depends only on `seed`, so the train and eval splits share it; their
    inputs come from separate streams of the seed (disjoint with probability one). W is
    scaled by 1/sqrt(in_features) so every target has a variance near 1: an untrained model
    starts near loss 1 and a trained one approaches `noise ** 2`.

    Args:
        sample_count: samples in this split.
        in_features: input size (the model's `in_features`).
        out_features: target size (the model's `out_features`).
        noise: standard deviation of the noise added to the targets, >= 0.
        split: "train" or "eval".
        seed: picks the teacher and the inputs.

    Raises:
        ValueError: a size that is not a positive int, a negative noise, a bad split or seed.
    """

    ARGUMENTS = ("sample_count", "in_features", "out_features", "noise")
    tokens_per_sample = None

    def __init__(
        self,
        sample_count: int = 1024,
        in_features: int = 32,
        out_features: int = 8,
        noise: float = 0.01,
        *,
        split: str = "train",
        seed: int = 0,
    ) -> None:
        _check_arguments(sample_count, in_features, out_features, noise, split, seed)
        self.split, self.seed = split, seed
        self.in_features, self.out_features = in_features, out_features
        teacher = generator(seed, _TEACHER)
        weight = torch.randn(in_features, out_features, generator=teacher) / in_features**0.5
        bias = 0.5 * torch.randn(out_features, generator=teacher)
        stream = generator(seed, _TRAIN if split == "train" else _EVAL)
        self.inputs = torch.randn(sample_count, in_features, generator=stream)
        noise_draw = torch.randn(sample_count, out_features, generator=stream)
        self.targets = self.inputs @ weight + bias + float(noise) * noise_draw

    @sizes_of(__init__)
    def sizes(cls, a: SimpleNamespace) -> TaskSizes:
        """`len` and `model_kwargs()` of the split these arguments build, without building it.

        Takes the constructor's arguments and raises what it raises.
        """
        _check_arguments(a.sample_count, a.in_features, a.out_features, a.noise, a.split, a.seed)
        return TaskSizes(a.sample_count, {"in_features": a.in_features, "out_features": a.out_features})

    def __len__(self) -> int:
        return self.inputs.size(0)

    def batch(self, indices: torch.Tensor | list[int]) -> dict[str, torch.Tensor]:
        """`{"input": (B, in_features), "target": (B, out_features)}`, float32 where the split is."""
        idx = as_index(indices, self.inputs.device, len(self))
        return {"input": self.inputs[idx], "target": self.targets[idx]}

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean squared error over the batch (in float32, also under autocast)."""
        return F.mse_loss(model(batch["input"]).float(), batch["target"])

    @torch.no_grad()
    def eval_sums(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`loss_sum` (per-sample MSE summed) and `count`, 0-d float64 on the batch's device."""
        error = model(batch["input"]).float() - batch["target"]
        per_sample = error.square().mean(dim=1)
        return {"loss_sum": per_sample.sum(dtype=torch.float64), "count": count_like(per_sample)}

    def model_kwargs(self) -> dict:
        """What the MLP must match: `in_features` and `out_features`."""
        return {"in_features": self.in_features, "out_features": self.out_features}
