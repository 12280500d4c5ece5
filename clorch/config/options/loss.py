"""The `loss` and `step` groups: how a batch becomes the loss (the data's, torch's, your model's, yours)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Optional

from clorch.config.registry import Option, declare, option


class LossOption(Option):
    """Any `loss` option."""

    for_built_in_data: ClassVar[bool] = False  # computes the built-in data's own loss (not a loss of yours)


class StepOption(Option):
    """Any `step` option."""


@dataclass
class TargetFunctionConfig(LossOption, StepOption):
    """A function named by `loss._target_` or `step._target_`; its other keys are keyword arguments."""

    target: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    name: str = "custom"


declare(
    "loss",
    "the loss: the data's, a torch loss, your model's own, or your function (loss._target_)",
    shorthand="name",
    custom=TargetFunctionConfig,
)
declare(
    "step", "how a batch becomes the loss: model(input) then the loss, or your function", custom=TargetFunctionConfig
)


@option("loss", "auto")
@option("loss", "cross_entropy", name="cross_entropy")
@option("loss", "mse", name="mse")
@dataclass
class LossConfig(LossOption):
    """The training loss: the data's own (auto), or a torch loss applied to model(input) and the target."""

    # auto: the built-in data's loss; cross_entropy: integer class targets against the output, or its
    # .logits (eval adds accuracy); mse: against the output
    name: Literal["auto", "cross_entropy", "mse"] = "auto"


@option("loss", "from_model")
@dataclass
class FromModelLossConfig(LossOption):
    """The loss your model returns itself: model(input, target), or model(**batch) for a dict batch.

    nanoGPT and Hugging Face's models compute their own loss. A dict batch without "input" and
    "target" keys (Hugging Face's input_ids, attention_mask, labels) is passed whole, labels inside.
    """

    name: Literal["from_model"] = "from_model"
    target_arg: Optional[str] = (
        None  # keyword the target is passed as (labels for Hugging Face); null: second positional
    )
    labels: Literal["target", "input"] = (
        "target"  # input: pass the input itself as the target, for models that shift it (HF causal LMs)
    )
    # also report accuracy: the output's logits (.logits, or beside the loss) ranked first over their
    # last dimension against the labels passed (a dict batch's "labels"; -100 is left out)
    accuracy: bool = False


@option("step", "auto")
@dataclass
class StepConfig(StepOption):
    """How a batch becomes a loss: auto runs model(input) and the loss; step._target_ names your own."""

    name: Literal["auto"] = "auto"  # auto: model(input), then the loss on (output, target)
