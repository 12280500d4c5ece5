"""`loss=chunked_cross_entropy`: the output layer and its cross-entropy fused, a chunk of tokens at a time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from clorch.config.options.loss import LossOption
from clorch.config.registry import default_of, option, rule

FUSED = "clorch.nn.fused_loss:linear_cross_entropy"

CHUNKED_DATA = ("text", "tokens")  # next-token data whose training loss is the mean over every token


@option("loss", "chunked_cross_entropy")
@dataclass
class ChunkedCrossEntropyConfig(LossOption):
    """Next-token cross-entropy from the model's hidden states and output matrix, a chunk of
    tokens at a time, never making the whole logits tensor (less memory, faster output layer).
    The model follows clorch.nn.fused_loss's protocol (model=gpt does); evaluation is unchanged."""

    for_built_in_data: ClassVar[bool] = True  # the built-in data's own loss, computed another way

    name: Literal["chunked_cross_entropy"] = "chunked_cross_entropy"
    # tokens per chunk: extra memory is about chunk_size x vocab float32 values
    chunk_size: int = field(default=default_of(FUSED, "chunk_size"), metadata=rule(ge=1, unit="tokens"))

    def rules(self, cfg: Any) -> list[str]:
        errors = []
        data = getattr(cfg.data, "name", None) if cfg.data is not None else None
        if data is not None and data not in CHUNKED_DATA:
            errors.append(
                f"loss=chunked_cross_entropy computes next-token cross-entropy over every token, "
                f"for data={' or data='.join(CHUNKED_DATA)}; got data={data} (use loss=auto there)"
            )
        model = getattr(cfg.model, "name", None) if cfg.model is not None else None
        if model == "mlp":
            errors.append(
                "loss=chunked_cross_entropy needs a language model with forward_hidden and output_weight "
                "(model=gpt, or your own: docs/training.md); got model=mlp"
            )
        if cfg.step is not None and cfg.step.name != "auto":
            errors.append(
                "loss=chunked_cross_entropy is the step's loss: it cannot run with step._target_ (drop one of them)"
            )
        return errors
