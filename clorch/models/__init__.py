"""Models the recipes can name: `mlp` (a multilayer perceptron) and `gpt` (decoder-only);
and `ResNet` (torchvision-style, BatchNorm) by target: `model._target_=clorch.models.resnet.ResNet`.

    >>> from clorch.models import build_model
    >>> model = build_model("gpt", n_layer=2, d_model=64, n_head=4)
"""

from __future__ import annotations

import inspect

from torch import nn

from clorch.models.gpt import GPT, GPTConfig
from clorch.models.mlp import MLP
from clorch.models.resnet import ResNet

__all__ = ["MLP", "GPT", "GPTConfig", "ResNet", "build_model", "MODEL_NAMES"]

MODEL_NAMES = ("mlp", "gpt")


def _check_kwargs(name: str, kwargs: dict, allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise TypeError(
            f"build_model({name!r}) got unknown argument(s) {', '.join(map(repr, unknown))}; "
            f"allowed: {', '.join(allowed)}"
        )


def build_model(name: str, **kwargs) -> nn.Module:
    """Build a model by name, on the CPU (move it to the device afterwards).

    Args:
        name: "mlp" (kwargs: `MLP`'s arguments) or "gpt" (kwargs: `GPTConfig` fields).
        **kwargs: the model's sizes; anything missing takes its default.

    Returns:
        The model, freshly initialized from torch's global RNG (seed it first for
        reproducible weights).

    Raises:
        ValueError: unknown `name`, or a size that breaks the model's rules.
        TypeError: an argument the model does not take.
    """
    if name == "mlp":
        allowed = tuple(inspect.signature(MLP.__init__).parameters)[1:]
        _check_kwargs(name, kwargs, allowed)
        return MLP(**kwargs)
    if name == "gpt":
        _check_kwargs(name, kwargs, GPTConfig.field_names())
        return GPT(GPTConfig(**kwargs))
    raise ValueError(f"model name must be one of {', '.join(MODEL_NAMES)}, got {name!r}")
