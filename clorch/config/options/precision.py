"""The `precision` group: fp32, bf16 autocast, or fp16 autocast with dynamic loss scaling."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Optional

from clorch.config.registry import Option, declare, default_of, option, rule
from clorch.precision import get_precision

SCALER = "clorch.amp.scaler:GradScaler"

declare("precision", "numerics: fp32, bf16 autocast, fp16 with a loss scaler, or fp8 (float8 Linear layers)")


class PrecisionOption(Option):
    """Any `precision` option. The engine builds `MixedPrecision(name, device, scaler=scaler_settings())`."""

    def scaler_settings(self) -> dict[str, Any] | bool | None:
        """MixedPrecision's `scaler` argument: None, no loss scaler."""
        return None

    # The `clorch.precision` mode the ranks run in (autocast, scaler, FSDP's dtypes) where it is not
    # the option's name: an attribute, not a method, so the name reaches MixedPrecision in one hand-off.
    runs_as: ClassVar[Optional[str]] = None

    def describe(self, device_type: str) -> str:
        """How a job runs in this precision, in words ("bf16 autocast")."""
        return get_precision(self.runs_as or self.name).describe(device_type)


@dataclass
class ScalerConfig:
    """Dynamic loss scaling (clorch.amp.GradScaler); fp16 only."""

    enabled: bool = True  # scale the loss and skip steps whose gradients overflow
    initial_scale: float = field(default=default_of(SCALER, "init_scale"), metadata=rule(gt=0))  # first loss scale
    growth_factor: float = field(
        default=default_of(SCALER, "growth_factor"), metadata=rule(gt=1)
    )  # scale *= this after growth_interval good steps
    backoff_factor: float = field(
        default=default_of(SCALER, "backoff_factor"), metadata=rule(gt=0, lt=1)
    )  # scale *= this on overflow
    growth_interval: int = field(
        default=default_of(SCALER, "growth_interval"), metadata=rule(ge=1)
    )  # steps without overflow before growing


@option("precision", "fp32")
@dataclass
class FP32Config(PrecisionOption):
    """Full fp32: no autocast, no scaler."""

    name: Literal["fp32"] = "fp32"


@option("precision", "bf16")
@dataclass
class BF16Config(PrecisionOption):
    """bf16 autocast (CUDA, or CPU autocast without GPUs); no scaler needed."""

    name: Literal["bf16"] = "bf16"


@option("precision", "fp16")
@dataclass
class FP16Config(PrecisionOption):
    """fp16 autocast with dynamic loss scaling."""

    name: Literal["fp16"] = "fp16"
    scaler: ScalerConfig = field(default_factory=ScalerConfig)

    def scaler_settings(self) -> dict[str, Any] | bool:
        """GradScaler's keyword arguments (`scaler`'s keys but `enabled`); False: fp16 unscaled,
        built as asked (the rules below refuse it before launch)."""
        if not self.scaler.enabled:
            return False
        return {k: v for k, v in dataclasses.asdict(self.scaler).items() if k != "enabled"}

    def rules(self, cfg: Any) -> list[str]:
        errors = []
        if not self.scaler.enabled:
            errors.append(
                "precision.scaler.enabled=false with precision=fp16 risks underflow: "
                "keep the scaler on for fp16 (use bf16 for no scaler)"
            )
        if cfg.ddp is not None and cfg.ddp.step_in_backward:
            errors.append(
                "ddp.step_in_backward=true cannot run with precision=fp16: the loss scaler decides "
                "to skip a step only after every gradient is in, and backward would already have "
                "stepped (use precision=bf16 or fp32, or ddp.step_in_backward=false)"
            )
        return errors


@dataclass(frozen=True)
class Needs:
    """What an option needs of the machine, checked before launch (`clorch.plan.machine`)."""

    key: str  # the key that asks for it, as the user wrote it (precision=fp8)
    module: str | None = None  # an importable module (an optional extra's)
    extra: str | None = None  # the clorch extra that installs it
    cuda: bool = False  # needs CUDA GPUs (backend nccl)
    capability: tuple[int, int] | None = None  # smallest CUDA compute capability (major, minor)
    why: str = ""  # what it needs them for, in words


@option("precision", "fp8")
@dataclass
class FP8Config(PrecisionOption):
    """float8 matrix products on the large Linear layers (torchao's float8 training), the rest
    in bf16 autocast; weights, checkpoints and exports stay high precision. Needs a GPU of
    compute capability 8.9 or more (H100, L4, RTX 4090) and `pip install 'clorch[fp8]'`."""

    runs_as: ClassVar[Optional[str]] = "bf16"  # everything but the converted layers' matrix products

    name: Literal["fp8"] = "fp8"
    recipe: Literal["tensorwise", "rowwise"] = "tensorwise"  # float8 scaling: one scale per tensor, or per row
    # convert a Linear only when both its in and out features are at least this (float8 pays on large matrices)
    min_features: int = field(default=1024, metadata=rule(ge=16, unit="features"))
    skip: list[str] = field(default_factory=list)  # Linear layers to keep high precision, by name (fnmatch patterns)
    keep_ends: bool = True  # keep the model's first and last Linear layers (input and output) high precision
    # parallel=fsdp with recipe=tensorwise: all-gather the weights in float8 (half the bytes)
    fsdp_float8_all_gather: bool = True

    def needs(self) -> list[Needs]:
        return [
            Needs(
                "precision=fp8",
                module="torchao",
                extra="fp8",
                cuda=True,
                capability=(8, 9),
                why="float8 matrix products run on GPUs of compute capability 8.9 or more (Ada, Hopper, Blackwell)",
            )
        ]

    def describe(self, device_type: str) -> str:
        return f"float8 Linear layers ({self.recipe} scaling) with {super().describe(device_type)}"

    def layer_rule(self) -> dict[str, Any]:
        """`clorch.amp.float8.choose_float8_layers`'s keyword arguments."""
        return {"min_features": self.min_features, "skip": list(self.skip), "keep_ends": self.keep_ends}
