"""The `precision` group: fp32, bf16 autocast, or fp16 autocast with dynamic loss scaling."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from clorch.config.registry import Option, declare, default_of, option, rule

SCALER = "clorch.amp.scaler:GradScaler"

declare("precision", "numerics: fp32, bf16 autocast, or fp16 with a loss scaler")


class PrecisionOption(Option):
    """Any `precision` option. The engine builds `MixedPrecision(name, device, scaler=scaler_settings())`."""

    def scaler_settings(self) -> dict[str, Any] | bool | None:
        """MixedPrecision's `scaler` argument: None, no loss scaler."""
        return None


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
