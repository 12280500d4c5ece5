"""Typed schemas, one dataclass per config group option.

The YAML files under `conf/` are the values users see and override; these
dataclasses say which keys each option may carry, their types and units, and
the rules `clorch.config.validate` checks (in each field's metadata). A field's
comment says what it does and its unit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

from clorch.precision import DTYPE_NAMES


def rule(**metadata: Any) -> dict[str, Any]:
    """Field metadata read by the validator: gt, ge, lt, le, choices, unit."""
    return metadata


@dataclass
class ScalerConfig:
    """Dynamic loss scaling (fp16 only)."""

    enabled: bool = False  # scale the loss and skip steps whose gradients overflow
    initial_scale: float = field(default=65536.0, metadata=rule(gt=0))  # first loss scale
    growth_factor: float = field(default=2.0, metadata=rule(gt=1))  # scale *= this after growth_interval good steps
    backoff_factor: float = field(default=0.5, metadata=rule(gt=0, lt=1))  # scale *= this on overflow
    growth_interval: int = field(default=2000, metadata=rule(ge=1))  # steps without overflow before growing


@dataclass
class PrecisionConfig:
    """Autocast dtype; fp16 adds the scaler."""

    name: str = field(default="bf16", metadata=rule(choices=("fp32", "bf16", "fp16")))
    scaler: ScalerConfig = field(default_factory=ScalerConfig)


@dataclass
class SamplerConfig:
    """clorch.data.DistributedSampler settings."""

    name: str = field(default="distributed", metadata=rule(choices=("distributed",)))
    seed: Optional[int] = None  # shuffling seed; null uses the top-level seed
    shuffle: bool = True  # a new permutation each epoch (set_epoch)
    drop_last: bool = False  # drop the tail instead of padding every rank to equal length


# ddp.reduce_dtype's names: clorch.nn.parallel.DistributedDataParallel accepts exactly these.
REDUCE_DTYPE_NAMES = DTYPE_NAMES


@dataclass
class DDPConfig:
    """clorch.nn.parallel.DistributedDataParallel settings."""

    bucket_cap_mb: float = field(default=25.0, metadata=rule(gt=0, unit="MiB"))  # gradient bucket size, MiB
    first_bucket_cap_mb: float = field(default=1.0, metadata=rule(gt=0, unit="MiB"))  # first (latency) bucket, MiB
    broadcast_buffers: bool = True  # broadcast rank 0's buffers before each forward
    # dtype gradient buckets travel in; null: the gradients' own (fp32 over fp32 gradients is the same)
    reduce_dtype: Optional[str] = field(default=None, metadata=rule(choices=(None, *REDUCE_DTYPE_NAMES)))


@dataclass
class CheckpointConfig:
    """When to write checkpoints and where to resume from."""

    policy: str = field(default="none", metadata=rule(choices=("none", "final", "periodic")))
    dir: Optional[str] = None  # checkpoint directory; null is <run dir>/checkpoints
    path: Optional[str] = None  # file of the final checkpoint; null is <dir>/final.ckpt
    every_n_steps: int = field(default=0, metadata=rule(ge=0, unit="steps"))  # periodic: steps between checkpoints
    keep_last: int = field(default=2, metadata=rule(ge=1))  # periodic: how many step checkpoints to keep
    resume: str = "none"  # none | latest (newest in dir) | a checkpoint file


@dataclass
class MLPConfig:
    """A multilayer perceptron; its in/out features come from the data."""

    name: str = "mlp"
    hidden_features: int = field(default=64, metadata=rule(ge=1))  # width of the hidden layers
    depth: int = field(default=2, metadata=rule(ge=1))  # number of hidden layers


@dataclass
class GPTConfig:
    """A small decoder-only transformer; vocab_size and seq_len come from the data."""

    name: str = "gpt"
    n_layer: int = field(default=2, metadata=rule(ge=1))  # transformer blocks
    n_head: int = field(default=2, metadata=rule(ge=1))  # attention heads
    d_model: int = field(default=64, metadata=rule(ge=1))  # residual width; divisible by n_head
    mlp_ratio: int = field(default=4, metadata=rule(ge=1))  # MLP width / d_model
    dropout: float = field(default=0.0, metadata=rule(ge=0, lt=1))  # dropout probability
    tie_weights: bool = True  # share the embedding and output matrices
    bias: bool = True  # biases in linear layers and layer norms
    vocab_size: Optional[int] = field(default=None, metadata=rule(ge=1))  # null: the data's (256 bytes)
    seq_len: Optional[int] = field(default=None, metadata=rule(ge=1))  # null: the data's


@dataclass
class SyntheticDataConfig:
    """Regression against a fixed random teacher (for the mlp)."""

    name: str = "synthetic"
    sample_count: int = field(default=1024, metadata=rule(ge=1))  # training samples
    in_features: int = field(default=32, metadata=rule(ge=1))  # input width
    out_features: int = field(default=8, metadata=rule(ge=1))  # target width
    noise: float = field(default=0.01, metadata=rule(ge=0))  # std of the target noise


@dataclass
class ArithmeticDataConfig:
    """Generated sums such as 123+456=579 (for the gpt); eval reports exact match."""

    name: str = "arithmetic"
    sample_count: int = field(default=2048, metadata=rule(ge=1))  # training samples
    digits: int = field(default=3, metadata=rule(ge=1, le=9))  # digits per operand
    eval_fraction: float = field(default=0.1, metadata=rule(gt=0, lt=1))  # held-out share of the pairs


@dataclass
class TextDataConfig:
    """Byte-level language modelling over a UTF-8 file."""

    name: str = "text"
    path: Optional[str] = None  # the UTF-8 file to model (required)
    seq_len: int = field(default=128, metadata=rule(ge=2))  # bytes per sample
    sample_count: Optional[int] = field(default=None, metadata=rule(ge=1))  # windows; null: tile the file
    eval_fraction: float = field(default=0.1, metadata=rule(gt=0, lt=1))  # held-out tail of the file


@dataclass
class OptimConfig:
    """clorch.optim.build_optimizer settings."""

    name: str = field(default="adamw", metadata=rule(choices=("adamw", "sgd")))
    lr: float = field(default=3e-3, metadata=rule(gt=0))  # peak learning rate
    weight_decay: float = field(default=0.0, metadata=rule(ge=0))  # decoupled (adamw) or L2 (sgd)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])  # adamw moment decays
    momentum: float = field(default=0.9, metadata=rule(ge=0, lt=1))  # sgd momentum
    fused: Optional[bool] = None  # fused kernels; null lets torch decide


@dataclass
class ScheduleConfig:
    """Learning-rate schedule, stepped once per optimizer step."""

    name: str = field(default="constant", metadata=rule(choices=("constant", "cosine")))
    warmup_steps: int = field(default=0, metadata=rule(ge=0))  # linear warmup, steps
    min_lr_ratio: float = field(default=0.1, metadata=rule(ge=0, le=1))  # cosine floor / peak lr


@dataclass
class LauncherConfig:
    """clorch.distributed.launch settings."""

    name: str = field(default="local", metadata=rule(choices=("local",)))
    nproc_per_node: Union[str, int] = "auto"  # ranks on this node; auto: one per GPU, or 2 on CPU
    devices: Optional[list[int]] = None  # CUDA device indices, one per local rank
    timeout: Optional[float] = field(default=None, metadata=rule(gt=0, unit="seconds"))  # whole-job limit, seconds
    nnodes: int = field(default=1, metadata=rule(ge=1))  # nodes in the job
    node_rank: int = field(default=0, metadata=rule(ge=0))  # this node's index
    master_addr: str = "127.0.0.1"  # rendezvous host
    master_port: Optional[int] = field(default=None, metadata=rule(ge=1, le=65535))  # null picks a free port
    max_restarts: int = field(default=0, metadata=rule(ge=0))  # restart a failed job, resuming from latest


@dataclass
class LoggerConfig:
    """metrics.jsonl is always written; tensorboard is optional."""

    name: str = field(default="jsonl", metadata=rule(choices=("jsonl", "tensorboard")))
    tensorboard: bool = False  # also write TensorBoard event files (needs the tensorboard extra)
    progress: str = field(default="auto", metadata=rule(choices=("auto", "bar", "lines", "off")))


@dataclass
class TopConfig:
    """Top-level keys."""

    backend: str = field(default="auto", metadata=rule(choices=("auto", "nccl", "gloo")))
    seed: int = field(default=0, metadata=rule(ge=0))  # seeds model init, data and sampler
    epochs: int = field(default=4, metadata=rule(ge=1))  # passes over the training split
    max_steps: Optional[int] = field(default=None, metadata=rule(ge=1))  # stop after this many steps
    batch_size: int = field(default=32, metadata=rule(ge=1))  # samples per micro-batch per rank
    accumulation: int = field(default=1, metadata=rule(ge=1))  # micro-batches per optimizer step
    log_every: int = field(default=10, metadata=rule(ge=1))  # steps between metrics lines
    eval_every: int = field(default=0, metadata=rule(ge=0))  # steps between evals; 0: at the end only
    compile: bool = False  # torch.compile the model
    fail_at_step: Optional[int] = field(default=None, metadata=rule(ge=1))  # test hook: last rank exits
    run_dir: Optional[str] = None  # set by the engine: where outputs go


GROUPS: dict[str, Any] = {
    "precision": PrecisionConfig,
    "sampler": SamplerConfig,
    "ddp": DDPConfig,
    "checkpoint": CheckpointConfig,
    "model": {"mlp": MLPConfig, "gpt": GPTConfig},
    "data": {"synthetic": SyntheticDataConfig, "arithmetic": ArithmeticDataConfig,
             "text": TextDataConfig},
    "optim": OptimConfig,
    "schedule": ScheduleConfig,
    "launcher": LauncherConfig,
    "logger": LoggerConfig,
}
"""Config key -> its schema, or {name: schema} where options carry different keys."""
