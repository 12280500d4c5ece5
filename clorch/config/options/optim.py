"""The `optim` and `schedule` groups: the optimizer and its learning-rate schedule.

The defaults are the library's (clorch.optim, clorch.optim.schedule), read from their source.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Optional

from clorch.config.registry import Option, constant_of, declare, option, rule

OPTIMIZERS = "clorch.optim"  # its constants: ADAMW_BETAS, SGD_MOMENTUM, DEFAULT_DECAY
SCHEDULES = "clorch.optim.schedule"  # its constants: COSINE_WARMUP_STEPS, COSINE_MIN_LR_RATIO
Decay = Literal["matrices", "all"]  # clorch.optim.DECAY_RULES

declare("optim", "the optimizer")
declare("schedule", "the learning-rate schedule")


class OptimOption(Option):
    """Any `optim` option: its keys are the torch optimizer's keyword arguments (`builds` names the
    class), but those clorch reads itself (CLORCH_KEYS)."""

    builds: ClassVar[str] = ""  # "module:Class" of the torch optimizer, called (param_groups, **kwargs())
    CLORCH_KEYS: ClassVar[tuple[str, ...]] = ("name", "decay", "grad_clip")

    def kwargs(self) -> dict[str, Any]:
        """The optimizer's keyword arguments: every other key, lists as tuples (AdamW's betas);
        `fused=None` is for the engine to decide (fused when every parameter is on CUDA)."""
        return {
            f.name: tuple(v) if isinstance(v := getattr(self, f.name), list) else v
            for f in dataclasses.fields(self)
            if f.name not in self.CLORCH_KEYS
        }

    def states(self) -> int:
        """Tensors of optimizer state per parameter, each of the parameter's size (memory plans)."""
        return 0


class ScheduleOption(Option):
    """Any `schedule` option; built as `clorch.optim.build_scheduler(optimizer, name, **kwargs(total_steps))`."""

    decays: ClassVar[bool] = False  # its length is the run's: build_scheduler takes total_steps

    def kwargs(self, total_steps: int) -> dict[str, Any]:
        """build_scheduler's keyword arguments: the option's keys but `name` (+ total_steps if it decays)."""
        keys = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "name"}
        return {**keys, "total_steps": total_steps} if self.decays else keys


@option("optim", "adamw")
@dataclass
class AdamWConfig(OptimOption):
    """torch.optim.AdamW."""

    builds: ClassVar[str] = "torch.optim:AdamW"

    name: Literal["adamw"] = "adamw"
    lr: float = field(default=3e-3, metadata=rule(gt=0))  # peak learning rate
    weight_decay: float = field(default=0.0, metadata=rule(ge=0))  # decoupled weight decay
    # which parameters decay: matrices (>= 2-d weights and kernels; not biases, norms, 1-d, embeddings,
    # nor position embeddings and tokens: pos_embed, cls_token, dist_token, *position_embedding*) | all
    decay: Decay = constant_of(OPTIMIZERS, "DEFAULT_DECAY")
    # clip the gradients' total 2-norm to this (after the all-reduce and unscaling); null: off
    grad_clip: Optional[float] = field(default=None, metadata=rule(gt=0))
    betas: list[float] = field(
        default_factory=lambda: list(constant_of(OPTIMIZERS, "ADAMW_BETAS")),  # moment decays
        metadata=rule(length=2, items=rule(ge=0, lt=1), words="in [0, 1)"),
    )
    fused: Optional[bool] = None  # fused kernels; null: fused when every parameter is on CUDA
    foreach: Optional[bool] = None  # multi-tensor kernels (torch's foreach); null: torch decides

    def states(self) -> int:
        return 2  # exp_avg, exp_avg_sq


@option("optim", "sgd")
@dataclass
class SGDConfig(OptimOption):
    """torch.optim.SGD with momentum."""

    builds: ClassVar[str] = "torch.optim:SGD"

    name: Literal["sgd"] = "sgd"
    lr: float = field(default=1e-2, metadata=rule(gt=0))  # peak learning rate
    weight_decay: float = field(default=0.0, metadata=rule(ge=0))  # L2 penalty
    # which parameters decay: matrices (>= 2-d weights and kernels; not biases, norms, 1-d, embeddings,
    # nor position embeddings and tokens: pos_embed, cls_token, dist_token, *position_embedding*) | all
    decay: Decay = constant_of(OPTIMIZERS, "DEFAULT_DECAY")
    # clip the gradients' total 2-norm to this (after the all-reduce and unscaling); null: off
    grad_clip: Optional[float] = field(default=None, metadata=rule(gt=0))
    momentum: float = field(
        default=constant_of(OPTIMIZERS, "SGD_MOMENTUM"), metadata=rule(ge=0, lt=1)
    )  # momentum factor
    fused: Optional[bool] = None  # fused kernels; null: fused when every parameter is on CUDA
    foreach: Optional[bool] = None  # multi-tensor kernels (torch's foreach); null: torch decides

    def states(self) -> int:
        return 1 if self.momentum else 0  # momentum_buffer


@option("schedule", "constant")
@dataclass
class ConstantScheduleConfig(ScheduleOption):
    """Constant learning rate after an optional linear warmup."""

    name: Literal["constant"] = "constant"
    warmup_steps: int = field(default=0, metadata=rule(ge=0, unit="steps"))  # linear warmup


@option("schedule", "cosine")
@dataclass
class CosineScheduleConfig(ScheduleOption):
    """Linear warmup, then cosine decay to min_lr_ratio * lr."""

    name: Literal["cosine"] = "cosine"
    decays: ClassVar[bool] = True
    warmup_steps: int = field(
        default=constant_of(SCHEDULES, "COSINE_WARMUP_STEPS"), metadata=rule(ge=0, unit="steps")
    )  # linear warmup
    min_lr_ratio: float = field(
        default=constant_of(SCHEDULES, "COSINE_MIN_LR_RATIO"), metadata=rule(ge=0, le=1)
    )  # floor / peak lr
