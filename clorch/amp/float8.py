"""`precision=fp8`: torchao's float8 training on the Linear layers where it pays.

torchao (`pip install 'clorch[fp8]'`) swaps an `nn.Linear` for a `Float8Linear` whose matrix
products cast their inputs, weights and output gradients to float8 with dynamic scales
(one per tensor, `tensorwise`, or per row, `rowwise`). The weights stay in their own dtype,
so the state dict's keys and values, checkpoints, resume, export and `model.init_from` are
those of the plain model. The rest of the model runs in bf16 autocast.

Float8 is slower than bf16 on small matrices (the casts and scales cost more than the faster
product saves), and its kernels need both sizes to be multiples of 16, so a rule chooses the
layers: `choose_float8_layers` reads only names and shapes and is tested without a GPU.
By default the model's first and last Linear layers (its input and output projections,
the most sensitive to rounding) stay high precision, as torchtitan does for the output.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Iterable, Sequence

from torch import nn

__all__ = ["LinearShape", "choose_float8_layers", "linear_shapes", "convert_to_float8", "carry_module_attributes"]

FLOAT8_MULTIPLE = 16  # float8 matrix-product kernels need in and out features divisible by this


@dataclass(frozen=True)
class LinearShape:
    """One Linear layer of a model: its qualified name and sizes, in registration order."""

    name: str
    in_features: int
    out_features: int


def choose_float8_layers(
    layers: Sequence[LinearShape], *, min_features: int = 1024, skip: Iterable[str] = (), keep_ends: bool = True
) -> list[str]:
    """The names of the layers to compute in float8, in the order given.

    A layer is chosen when both its sizes are multiples of 16 and at least `min_features`,
    no `skip` pattern (fnmatch, on the qualified name) matches it, and, with `keep_ends`,
    it is neither the first nor the last layer listed.

    Raises:
        ValueError: min_features < 1.
    """
    if isinstance(min_features, bool) or not isinstance(min_features, int) or min_features < 1:
        raise ValueError(f"min_features must be an int >= 1 (features), got {min_features!r}")
    patterns = list(skip)
    ends = {layers[0].name, layers[-1].name} if keep_ends and layers else set()
    chosen = []
    for layer in layers:
        sizes = (layer.in_features, layer.out_features)
        if any(size % FLOAT8_MULTIPLE or size < min_features for size in sizes):
            continue
        if layer.name in ends or any(fnmatch.fnmatchcase(layer.name, p) for p in patterns):
            continue
        chosen.append(layer.name)
    return chosen


def linear_shapes(model: nn.Module) -> list[LinearShape]:
    """Every `nn.Linear` of `model` (a weight shared by two layers counts at its first name)."""
    return [
        LinearShape(name, module.in_features, module.out_features)
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
    ]


def convert_to_float8(
    model: nn.Module,
    *,
    recipe: str = "tensorwise",
    min_features: int = 1024,
    skip: Iterable[str] = (),
    keep_ends: bool = True,
    fsdp_float8_all_gather: bool = False,
) -> list[str]:
    """Swap the chosen Linear layers of `model` for torchao's `Float8Linear`, in place, before
    DDP, fully_shard or torch.compile wrap it. Returns the converted layers' names.

    Args:
        recipe: "tensorwise" or "rowwise" (torchao's recipe names).
        fsdp_float8_all_gather: all-gather weights in float8 under fully_shard (tensorwise only;
            it is ignored for rowwise, which torchao does not support it for).

    Raises:
        ImportError: torchao is not installed (`pip install 'clorch[fp8]'`).
        ValueError: an unknown recipe, or min_features < 1.
    """
    try:  # torchao is an optional extra
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as exc:
        raise ImportError(f"precision=fp8 needs torchao: pip install 'clorch[fp8]' ({exc})") from exc

    if recipe not in ("tensorwise", "rowwise"):
        raise ValueError(f"precision.recipe must be tensorwise or rowwise, got {recipe!r}")
    chosen = set(choose_float8_layers(linear_shapes(model), min_features=min_features, skip=skip, keep_ends=keep_ends))
    if not chosen:
        return []
    config = Float8LinearConfig.from_recipe_name(recipe)
    if recipe == "tensorwise" and fsdp_float8_all_gather:
        config = Float8LinearConfig(enable_fsdp_float8_all_gather=True)
    replaced = {name: model.get_submodule(name) for name in chosen}
    convert_to_float8_training(model, config=config, module_filter_fn=lambda module, fqn: fqn in chosen)
    carry_module_attributes(model, replaced)
    return sorted(chosen)


def carry_module_attributes(model: nn.Module, replaced: dict[str, nn.Module]) -> None:
    """Give each module of `model` that took the place of one in `replaced` (qualified name: the
    module it replaced) the public attributes the replaced one held and it lacks.

    A model may tag its layers with attributes its initializer reads: the built-in GPT's
    residual projections carry `is_residual_projection`, which gives them a smaller initial
    std. torchao's `Float8Linear.from_float` builds a new module that keeps only the weight
    and bias, and a model built on the meta device (`parallel=fsdp`) is initialized after the
    conversion (`clorch.nn.parallel.fsdp_init.materialize`): without its tags, a layer would
    start from other values than in the bf16 model. Local.
    """
    for name, old in replaced.items():
        new = model.get_submodule(name)
        if new is old:
            continue
        for key, value in vars(old).items():
            if not key.startswith("_") and not hasattr(new, key):
                setattr(new, key, value)
