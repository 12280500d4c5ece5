"""The typed config: the top-level keys and `TrainConfig`, one option per group.

The options themselves are dataclasses in `clorch.config.options`, one module per
group, joined to their group by `clorch.config.registry`; they are the single source
of every default. `conf/` holds one YAML file per option written from them
(`clorch.config.conf_files`: `optim=sgd` composes `conf/optim/sgd.yaml`, which is
`SGDConfig()`'s values), `clorch.config.checks` validates a composed config against
them, and `TrainConfig.from_dict` turns the validated config into the object the engine
and the ranks read (`cfg.optim.lr`, not `cfg["optim"]["lr"]`).

A field's comment says what it does and its unit; `rule(...)` metadata holds the ranges
the validator checks, and `Literal` annotations the allowed values. An option carries only
its own keys: `sgd` has no `betas`, `constant` no `min_lr_ratio`. Where a key configures a
clorch class, its default is read from that class's source (clorch.config.source_defaults),
so the config and the library cannot disagree and composing a config imports no torch.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from clorch.config import registry
from clorch.config.options.checkpoint import CheckpointConfig
from clorch.config.options.data import (
    DATA_LOADER_KEYS,
    ArithmeticDataConfig,
    DataOption,
    SyntheticDataConfig,
    TargetDataConfig,
    TextDataConfig,
    TokensDataConfig,
)
from clorch.config.options.ddp import DDPConfig
from clorch.config.options.launcher import LauncherOption, LocalLauncherConfig, TorchrunLauncherConfig
from clorch.config.options.logger import LoggerConfig
from clorch.config.options.loss import (
    FromModelLossConfig,
    LossConfig,
    LossOption,
    StepConfig,
    StepOption,
    TargetFunctionConfig,
)
from clorch.config.options.model import MODEL_LOAD_KEYS, GPTConfig, MLPConfig, ModelOption, TargetModelConfig
from clorch.config.options.optim import (
    AdamWConfig,
    ConstantScheduleConfig,
    CosineScheduleConfig,
    OptimOption,
    ScheduleOption,
    SGDConfig,
)
from clorch.config.options.parallel import DDPParallelConfig, FSDPParallelConfig, ParallelOption
from clorch.config.options.precision import BF16Config, FP16Config, FP32Config, PrecisionOption, ScalerConfig
from clorch.config.options.sampler import SamplerConfig
from clorch.config.registry import default_of, rule  # noqa: F401  (default_of: importable from here as before)
from clorch.preflight.options import PreflightConfig

__all__ = [  # the options, importable from here as before
    "DATA_LOADER_KEYS",
    "MODEL_LOAD_KEYS",
    "AdamWConfig",
    "ArithmeticDataConfig",
    "BF16Config",
    "CheckpointConfig",
    "ConstantScheduleConfig",
    "CosineScheduleConfig",
    "DDPConfig",
    "DDPParallelConfig",
    "FP16Config",
    "FP32Config",
    "FSDPParallelConfig",
    "FromModelLossConfig",
    "GPTConfig",
    "LocalLauncherConfig",
    "LoggerConfig",
    "LossConfig",
    "MLPConfig",
    "PreflightConfig",
    "SGDConfig",
    "SamplerConfig",
    "ScalerConfig",
    "StepConfig",
    "SyntheticDataConfig",
    "TargetDataConfig",
    "TargetFunctionConfig",
    "TargetModelConfig",
    "TextDataConfig",
    "TokensDataConfig",
    "TopConfig",
    "TorchrunLauncherConfig",
    "TrainConfig",
]


# --- the top level ----------------------------------------------------------------------------
# torch.compile modes (compile_mode); "reduce-overhead" and "max-autotune" replay CUDA graphs.
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "reduce-overhead", "max-autotune")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


@dataclass
class TopConfig:
    """Keys at the top level of the config (not in a group)."""

    backend: Literal["auto", "nccl", "gloo"] = "auto"  # process-group backend; auto: nccl with CUDA, gloo without
    seed: int = field(default=0, metadata=rule(ge=0))  # seeds model init, data and sampler
    epochs: int = field(default=4, metadata=rule(ge=1))  # passes over the training split
    max_steps: Optional[int] = field(default=None, metadata=rule(ge=1, unit="steps"))  # stop here (overrides epochs)
    batch_size: int = field(default=32, metadata=rule(ge=1))  # samples per micro-batch, per rank
    accumulation: int = field(default=1, metadata=rule(ge=1))  # micro-batches per optimizer step
    log_every: int = field(default=10, metadata=rule(ge=1, unit="steps"))  # steps between metrics lines
    eval_every: int = field(default=0, metadata=rule(ge=0, unit="steps"))  # steps between evals; 0: at the end
    compile: bool = False  # torch.compile the model (and a language-model task's loss)
    # torch.compile mode with compile: true; the max-autotune modes tune the matmuls (minutes of
    # compiling first); reduce-overhead and max-autotune replay CUDA graphs (accumulation 1 only)
    compile_mode: Literal[COMPILE_MODES] = "default"
    # The same weights, bit for bit, on any world size with the same global batch (batch_size x
    # accumulation x ranks), under parallel=ddp and parallel=fsdp alike: micro-batches, draws and the
    # gradient's sum fixed by the data, not the ranks (clorch.strategies.exact, exact_fsdp;
    # docs/reproducibility.md)
    exact: bool = False


BACKENDS = ("auto", "gloo", "nccl")
"""The `backend` group's options: each sets the top-level `backend` key."""

CUSTOM = "custom"
"""The option a group section selects when it names your own code with `_target_`."""

TARGET_SCHEMAS = registry.custom_groups()
"""Group -> the schema of its section when it names `_target_` (model, data, loss, step)."""
TARGET_GROUPS = tuple(TARGET_SCHEMAS)
SHORTHAND = {name: g.shorthand for name, g in registry.groups().items() if g.shorthand}
"""Sections whose one key may be given as the section's value: `preflight=only` (or a recipe's
`preflight: only`) is `preflight.mode=only`, as a user of the option expects to write it."""


# --- the whole config, as the engine reads it ---------------------------------------------------
@dataclass
class TrainConfig(TopConfig):
    """A whole validated config: the top-level keys and one option per group (a field per group
    that clorch.config.registry declares; tests/config/test_registry.py holds them equal)."""

    precision: PrecisionOption = field(default_factory=BF16Config)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    ddp: DDPConfig = field(default_factory=DDPConfig)
    parallel: ParallelOption = field(default_factory=DDPParallelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    model: ModelOption = field(default_factory=MLPConfig)
    data: DataOption = field(default_factory=SyntheticDataConfig)
    optim: OptimOption = field(default_factory=AdamWConfig)
    schedule: ScheduleOption = field(default_factory=ConstantScheduleConfig)
    launcher: LauncherOption = field(default_factory=LocalLauncherConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    preflight: PreflightConfig = field(default_factory=PreflightConfig)
    loss: LossOption = field(default_factory=LossConfig)
    step: StepOption = field(default_factory=StepConfig)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TrainConfig":
        """Build from a composed, *validated* config (plain containers; see clorch.config.checks).

        Raises:
            KeyError, TypeError: `values` was not validated (a missing or unknown key).
        """
        groups = {group: section_from_dict(group, values[group]) for group in registry.groups()}
        return cls(**top_values(values), **groups)

    def to_dict(self) -> dict[str, Any]:
        """Plain containers again (what `from_dict` takes; `_target_` for a target model)."""
        out = dataclasses.asdict(self)
        for group in TARGET_GROUPS:
            section = getattr(self, group)
            if hasattr(section, "target"):  # clorch's own keys only where they differ from the default
                defaults = {f.name: f.default for f in dataclasses.fields(section)}
                own = {
                    k: v
                    for k, v in dataclasses.asdict(section).items()
                    if k not in ("target", "kwargs", "name") and v != defaults[k]
                }
                out[group] = {"_target_": section.target, **section.kwargs, **own}
        return out


def top_values(values: dict[str, Any]) -> dict[str, Any]:
    """The top-level keys of a validated config (TopConfig's), without its group sections."""
    return {f.name: values[f.name] for f in dataclasses.fields(TopConfig)}


def target_section(group: str, values: dict[str, Any]) -> Any:
    """A `_target_` section as its dataclass: clorch's own keys as fields, the rest as kwargs."""
    cls = TARGET_SCHEMAS[group]
    own = {f.name for f in dataclasses.fields(cls)} - {"target", "kwargs", "name"}
    kwargs = {k: v for k, v in values.items() if k not in ("_target_", "name") and k not in own}
    return cls(target=values["_target_"], kwargs=kwargs, **{k: v for k, v in values.items() if k in own})


def section_from_dict(group: str, values: dict[str, Any]) -> Any:
    """One group's validated values as its option's dataclass (a TARGET_SCHEMAS one for `_target_`)."""
    if group in TARGET_SCHEMAS and "_target_" in values:
        return target_section(group, values)
    options = registry.options(group)
    values = {k: v for k, v in values.items() if k != "_target_"}  # reported by the checks elsewhere
    selector = registry.groups()[group].selector
    cls = type(options[values[selector]] if selector else next(iter(options.values())))
    return cls(**{**values, **_nested(cls, values)})


def _nested(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """The nested sections of `values` (fp16's `scaler`) built as their dataclasses."""
    hints = typing.get_type_hints(cls)
    return {
        k: hints[k](**{**v, **_nested(hints[k], v)})
        for k, v in values.items()
        if isinstance(v, dict) and dataclasses.is_dataclass(hints.get(k))
    }
