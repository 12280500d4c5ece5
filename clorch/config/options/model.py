"""The `model` group: the built-in models, or your own with `model._target_`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from clorch.config.options.precision import Needs
from clorch.config.registry import Option, declare, default_of, option, rule

MLP = "clorch.models.mlp:MLP"
GPT = "clorch.models.gpt:GPTConfig"

MODEL_LOAD_KEYS = ("init_from", "init_strict", "activation_checkpointing")
"""Keys of model sections that clorch reads (never passed to the model's class)."""


class ModelOption(Option):
    """Any `model` option."""


@dataclass
class TargetModelConfig(ModelOption):
    """A model named by `model._target_` (allow-listed); its other keys are keyword arguments
    (but `init_from` and `init_strict`, which clorch reads as for the built-in models)."""

    target: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    name: str = "custom"
    init_from: Optional[str] = field(
        default=None, metadata=rule(path=True)
    )  # start from these weights (see MLPConfig.init_from)
    init_strict: bool = True  # init_from must hold exactly the model's keys and shapes
    # Liger-Kernel's fused Triton kernels for a Hugging Face model (Llama, Mistral, Qwen, Gemma, ...),
    # with loss=from_model; needs CUDA and pip install 'clorch[liger]'
    liger: bool = False

    def needs(self) -> list[Needs]:
        if not self.liger:
            return []
        return [
            Needs("model.liger=true", module="liger_kernel", extra="liger", cuda=True, why="its kernels are Triton's")
        ]

    def rules(self, cfg: Any) -> list[str]:
        if self.liger and cfg.loss is not None and cfg.loss.name != "from_model":
            return [
                f"model.liger=true patches a Hugging Face model, whose loss it fuses: it needs loss=from_model "
                f"(loss.target_arg=labels loss.labels=input), got loss={cfg.loss.name}"
            ]
        return []


declare("model", "the model: mlp, gpt, or your own class (model._target_)", custom=TargetModelConfig)


@option("model", "mlp")
@dataclass
class MLPConfig(ModelOption):
    """A multilayer perceptron; its in/out features come from the data."""

    name: Literal["mlp"] = "mlp"
    hidden_features: int = field(default=default_of(MLP, "hidden_features"), metadata=rule(ge=1))  # hidden width
    depth: int = field(default=default_of(MLP, "depth"), metadata=rule(ge=1))  # Linear layers
    # start from these weights: a clorch checkpoint, a torch state_dict file or .safetensors
    init_from: Optional[str] = field(default=None, metadata=rule(path=True))
    init_strict: bool = True  # init_from must hold exactly the model's keys and shapes


@option("model", "gpt")
@dataclass
class GPTConfig(ModelOption):
    """A small decoder-only transformer; vocab_size and seq_len come from the data."""

    name: Literal["gpt"] = "gpt"
    n_layer: int = field(default=default_of(GPT, "n_layer"), metadata=rule(ge=1))  # transformer blocks
    n_head: int = field(default=default_of(GPT, "n_head"), metadata=rule(ge=1))  # attention heads; must divide d_model
    d_model: int = field(default=default_of(GPT, "d_model"), metadata=rule(ge=1))  # residual width
    mlp_ratio: float = field(default=default_of(GPT, "mlp_ratio"), metadata=rule(gt=0))  # MLP width / d_model
    dropout: float = field(default=default_of(GPT, "dropout"), metadata=rule(ge=0, lt=1))  # dropout probability
    tie_weights: bool = default_of(GPT, "tie_weights")  # share the embedding and output matrices
    bias: bool = default_of(GPT, "bias")  # biases in linear layers and layer norms
    vocab_size: Optional[int] = field(default=None, metadata=rule(ge=1))  # null: the data's (256 bytes)
    seq_len: Optional[int] = field(default=None, metadata=rule(ge=1))  # null: the data's
    # start from these weights: a clorch checkpoint, a torch state_dict file or .safetensors
    init_from: Optional[str] = field(default=None, metadata=rule(path=True))
    init_strict: bool = True  # init_from must hold exactly the model's keys and shapes
    # recompute each block's activations in backward instead of keeping them (less memory, about
    # one more forward of compute); under parallel=ddp and fsdp alike
    activation_checkpointing: bool = False

    def rules(self, cfg: Any) -> list[str]:
        if self.d_model % self.n_head:
            return [f"model.d_model ({self.d_model}) must be divisible by model.n_head ({self.n_head})"]
        return []
