"""The `data` group: the built-in tasks, or your own map-style dataset with `data._target_`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Optional

from clorch.config.registry import Option, declare, default_of, option, rule

SYNTHETIC = "clorch.data.synthetic:SyntheticRegression"
ARITHMETIC = "clorch.data.arithmetic:ArithmeticTask"
TEXT = "clorch.data.text:ByteTextTask"
TOKENS = "clorch.data.tokens:TokenFileTask"


class DataOption(Option):
    """Any `data` option; a built-in task names its class and the built-in model it trains."""

    task: ClassVar[Optional[str]] = None  # "module:Class" of the task (clorch.data.base.Task)
    model: ClassVar[Optional[str]] = None  # the built-in model that fits its samples

    def rules(self, cfg: Any) -> list[str]:
        model = cfg.model
        if self.model and model is not None and not hasattr(model, "target") and model.name != self.model:
            return [f"model={model.name} cannot train data={self.name}: use model={self.model}"]
        return []


@dataclass
class TargetDataConfig(DataOption):
    """Your own map-style torch Dataset, named by `data._target_` (trusted like a model).

    The section's keys below are clorch's (how the data is split and loaded); every
    other key is a keyword argument of the dataset's class.
    """

    target: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    name: str = "custom"
    eval_fraction: float = field(
        default=0.1, metadata=rule(gt=0, lt=1)
    )  # held-out tail when the class takes no `split` argument
    collate_fn: Optional[dict[str, Any]] = (
        None  # {_target_: my_pkg.collate}: merges items into a batch; null: torch's default_collate
    )
    num_workers: int = field(
        default=0, metadata=rule(ge=0)
    )  # DataLoader worker processes per rank; 0 loads in the rank
    pin_memory: Optional[bool] = None  # page-locked host batches; null: on CUDA
    persistent_workers: bool = False  # keep the workers between epochs (num_workers > 0)
    prefetch_factor: Optional[int] = field(
        default=None, metadata=rule(ge=1)
    )  # batches each worker loads ahead; null: torch's (2)


declare("data", "the data: a built-in task, or your own dataset (data._target_)", custom=TargetDataConfig)

DATA_LOADER_KEYS = tuple(
    f.name for f in dataclasses.fields(TargetDataConfig) if f.name not in ("target", "kwargs", "name")
)
"""Keys of a `data._target_` section that clorch reads; the others go to the dataset's class."""


@option("data", "synthetic")
@dataclass
class SyntheticDataConfig(DataOption):
    """Regression against a fixed random teacher (for the mlp)."""

    task: ClassVar[Optional[str]] = SYNTHETIC
    model: ClassVar[Optional[str]] = "mlp"

    name: Literal["synthetic"] = "synthetic"
    sample_count: int = field(default=default_of(SYNTHETIC, "sample_count"), metadata=rule(ge=1))  # training samples
    in_features: int = field(default=default_of(SYNTHETIC, "in_features"), metadata=rule(ge=1))  # input width
    out_features: int = field(default=default_of(SYNTHETIC, "out_features"), metadata=rule(ge=1))  # target width
    noise: float = field(default=default_of(SYNTHETIC, "noise"), metadata=rule(ge=0))  # std of the target noise


@option("data", "arithmetic")
@dataclass
class ArithmeticDataConfig(DataOption):
    """Generated sums such as 123+456=579 (for the gpt); eval reports exact match."""

    task: ClassVar[Optional[str]] = ARITHMETIC
    model: ClassVar[Optional[str]] = "gpt"

    name: Literal["arithmetic"] = "arithmetic"
    sample_count: int = field(default=default_of(ARITHMETIC, "sample_count"), metadata=rule(ge=1))  # training samples
    digits: int = field(default=default_of(ARITHMETIC, "digits"), metadata=rule(ge=1, le=9))  # digits per operand
    eval_fraction: float = field(
        default=default_of(ARITHMETIC, "eval_fraction"), metadata=rule(gt=0, lt=1)
    )  # held-out share of the pairs


@option("data", "text")
@dataclass
class TextDataConfig(DataOption):
    """Byte-level language modelling over a UTF-8 file: data.path=/path/to/file.txt."""

    task: ClassVar[Optional[str]] = TEXT
    model: ClassVar[Optional[str]] = "gpt"

    name: Literal["text"] = "text"
    path: Optional[str] = field(default=None, metadata=rule(path=True))  # the UTF-8 file to model (required)
    seq_len: int = field(default=default_of(TEXT, "seq_len"), metadata=rule(ge=2))  # bytes per sample
    sample_count: Optional[int] = field(
        default=default_of(TEXT, "sample_count"), metadata=rule(ge=1)
    )  # windows; null: tile the file
    eval_fraction: float = field(
        default=default_of(TEXT, "eval_fraction"), metadata=rule(gt=0, lt=1)
    )  # held-out tail of the file

    def rules(self, cfg: Any) -> list[str]:
        errors = super().rules(cfg)
        if self.path is None:
            errors.append("data.path is required for data=text: name a UTF-8 file")
        elif not Path(self.path).expanduser().is_file():
            errors.append(f"data.path={self.path!r} does not exist or is not a file")
        return errors


@option("data", "tokens")
@dataclass
class TokensDataConfig(DataOption):
    """Language modelling over token files: nanoGPT's train.bin/val.bin, or llm.c's .bin files."""

    task: ClassVar[Optional[str]] = TOKENS
    model: ClassVar[Optional[str]] = "gpt"

    name: Literal["tokens"] = "tokens"
    train_path: Optional[str] = field(default=None, metadata=rule(path=True))  # the training tokens (required)
    # the held-out tokens; null holds out the train file's last eval_fraction
    eval_path: Optional[str] = field(default=None, metadata=rule(path=True))
    seq_len: int = field(
        default=default_of(TOKENS, "seq_len"), metadata=rule(ge=1)
    )  # tokens per sample (the model's seq_len follows)
    vocab_size: int = field(
        default=default_of(TOKENS, "vocab_size"), metadata=rule(ge=1)
    )  # the model's vocabulary; every id must be below it
    dtype: Literal["uint16", "uint32"] = default_of(TOKENS, "dtype")  # token width of a headerless file
    header: Literal["auto", "none", "llmc"] = default_of(
        TOKENS, "header"
    )  # auto: llm.c's 256-int32 header when its magic is there
    sample_count: Optional[int] = field(
        default=default_of(TOKENS, "sample_count"), metadata=rule(ge=1)
    )  # windows; null: every non-overlapping window
    eval_fraction: float = field(
        default=default_of(TOKENS, "eval_fraction"), metadata=rule(gt=0, lt=1)
    )  # held-out tail without eval_path

    def rules(self, cfg: Any) -> list[str]:
        errors = super().rules(cfg)
        if self.train_path is None:
            errors.append(
                "data.train_path is required for data=tokens: name a token file (nanoGPT's train.bin, or an llm.c .bin)"
            )
        return errors
