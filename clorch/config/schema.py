"""The typed config: one dataclass per config group option, and `TrainConfig` holding them all.

These dataclasses are the single source of every default. `conf/` holds one
YAML file per option written from them (`clorch.config.conf_files`: `optim=sgd`
composes `conf/optim/sgd.yaml`, which is `SGDConfig()`'s values),
`clorch.config.checks` validates a composed config against them, and
`TrainConfig.from_dict` turns the validated config into the object the engine
and the ranks read (`cfg.optim.lr`, not `cfg["optim"]["lr"]`).

A field's comment says what it does and its unit; `rule(...)` metadata holds
the ranges the validator checks, and `Literal` annotations the allowed values.
An option carries only its own keys: `sgd` has no `betas`, `constant` no
`min_lr_ratio`. Where a key configures a clorch class, its default is read
from that class (`GPTConfig`, `MLP`, `GradScaler`, `DistributedSampler`,
`DistributedDataParallel`, the data tasks, `launch`), so the config and the
library cannot disagree; it is read from the class's source, not by importing
it (clorch.config.source_defaults), so that composing a config imports no torch.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional, Union

from clorch.config.source_defaults import source_constant, source_default
from clorch.precision import DTYPE_NAMES
from clorch.preflight.options import PreflightConfig

# The classes whose defaults the config takes, named by module and name: their defaults are
# read from the source (clorch.config.source_defaults), so composing a config imports no torch.
GradScaler = ("clorch.amp.scaler", "GradScaler")
DistributedSampler = ("clorch.data.sampler", "DistributedSampler")
DistributedDataParallel = ("clorch.nn.parallel.ddp", "DistributedDataParallel")
MLP = ("clorch.models.mlp", "MLP")
Optimizers = "clorch.optim"  # its constants: ADAMW_BETAS, SGD_MOMENTUM, DEFAULT_DECAY
Schedules = "clorch.optim.schedule"  # its constants: COSINE_WARMUP_STEPS, COSINE_MIN_LR_RATIO
GPTArchitecture = ("clorch.models.gpt", "GPTConfig")
SyntheticRegression = ("clorch.data.synthetic", "SyntheticRegression")
ArithmeticTask = ("clorch.data.arithmetic", "ArithmeticTask")
ByteTextTask = ("clorch.data.text", "ByteTextTask")
TokenFiles = ("clorch.data.tokens", "TokenFileTask")
launch = ("clorch.launch.launcher", "launch")
YEAR = source_constant("clorch.launch.config", "MAX_SECONDS")  # longer waits are mistakes


def rule(**metadata: Any) -> dict[str, Any]:
    """Field metadata read by the validator: gt, ge, lt, le (bounds) and unit."""
    return metadata


def default_of(owner: tuple[str, str] | Callable[..., Any] | type, name: str) -> Any:
    """The default of argument `name` of `owner` (a function, a class's __init__ or a dataclass;
    given as (module, name), it is read from the source without importing the module)."""
    if isinstance(owner, tuple):
        return source_default(*owner, name)
    if dataclasses.is_dataclass(owner):
        return {f.name: f.default for f in dataclasses.fields(owner)}[name]
    return inspect.signature(owner).parameters[name].default


ReduceDtype = Literal[(None, *DTYPE_NAMES)]  # type: ignore[valid-type]
Decay = Literal["matrices", "all"]  # clorch.optim.DECAY_RULES


# --- precision -------------------------------------------------------------------------------
@dataclass
class ScalerConfig:
    """Dynamic loss scaling (clorch.amp.GradScaler); fp16 only."""

    enabled: bool = True  # scale the loss and skip steps whose gradients overflow
    initial_scale: float = field(default=default_of(GradScaler, "init_scale"), metadata=rule(gt=0))  # first loss scale
    growth_factor: float = field(
        default=default_of(GradScaler, "growth_factor"), metadata=rule(gt=1)
    )  # scale *= this after growth_interval good steps
    backoff_factor: float = field(
        default=default_of(GradScaler, "backoff_factor"), metadata=rule(gt=0, lt=1)
    )  # scale *= this on overflow
    growth_interval: int = field(
        default=default_of(GradScaler, "growth_interval"), metadata=rule(ge=1)
    )  # steps without overflow before growing


@dataclass
class FP32Config:
    """Full fp32: no autocast, no scaler."""

    name: Literal["fp32"] = "fp32"


@dataclass
class BF16Config:
    """bf16 autocast (CUDA, or CPU autocast without GPUs); no scaler needed."""

    name: Literal["bf16"] = "bf16"


@dataclass
class FP16Config:
    """fp16 autocast with dynamic loss scaling."""

    name: Literal["fp16"] = "fp16"
    scaler: ScalerConfig = field(default_factory=ScalerConfig)


# --- sampler, ddp, checkpoint ----------------------------------------------------------------
@dataclass
class SamplerConfig:
    """clorch.data.DistributedSampler: a disjoint, deterministic shard per rank."""

    name: Literal["distributed"] = "distributed"
    seed: Optional[int] = None  # shuffling seed; null uses the top-level seed
    shuffle: bool = default_of(DistributedSampler, "shuffle")  # a new permutation each epoch (set_epoch)
    drop_last: bool = default_of(
        DistributedSampler, "drop_last"
    )  # drop the tail instead of padding every rank to equal length


@dataclass
class DDPConfig:
    """clorch.nn.parallel.DistributedDataParallel settings."""

    bucket_cap_mb: float = field(
        default=source_constant("clorch.nn.parallel.ddp", "DEFAULT_BUCKET_CAP_MB"), metadata=rule(gt=0, unit="MiB")
    )  # gradient bucket size, MiB
    first_bucket_cap_mb: float = field(
        default=default_of(DistributedDataParallel, "first_bucket_cap_mb"), metadata=rule(gt=0, unit="MiB")
    )  # first bucket: starts communication early, MiB
    broadcast_buffers: bool = default_of(
        DistributedDataParallel, "broadcast_buffers"
    )  # broadcast rank 0's buffers before each forward
    # dtype gradient buckets travel in; null: the gradients' own
    reduce_dtype: ReduceDtype = None
    # keep .grad in the buckets across zero_grad(set_to_none=True): backward accumulates in place
    gradient_as_bucket_view: bool = default_of(DistributedDataParallel, "gradient_as_bucket_view")
    # step each bucket's parameters as soon as its all-reduce is done, overlapping the optimizer
    # step with communication (same numerics; not with precision=fp16)
    step_in_backward: bool = False
    # CUDA: copy new gradients into their bucket on a side stream, one copy per full bucket
    overlap_grad_copies: bool = default_of(DistributedDataParallel, "overlap_grad_copies")


@dataclass
class DDPParallelConfig:
    """Data parallel: every rank holds the whole model; clorch's reducer (the `ddp` group's keys)."""

    name: Literal["ddp"] = "ddp"


@dataclass
class FSDPParallelConfig:
    """Sharded data parallel (torch's fully_shard): each rank holds 1/world of the model's state.

    Parameters, gradients and optimizer state are split over the job's ranks
    (clorch.nn.parallel.fsdp); the `ddp` group's keys do not apply.
    """

    name: Literal["fsdp"] = "fsdp"
    # which modules get their own fully_shard: auto (the built-in GPT's blocks; for other models
    # every child with >= min_params parameters) or a list of class names, e.g. [Block]
    shard: Union[Literal["auto"], list[str]] = "auto"
    min_params: int = field(
        default=source_constant("clorch.nn.parallel.fsdp", "AUTO_MIN_PARAMS"), metadata=rule(ge=1)
    )  # shard=auto: parameters a child needs to be a unit of its own
    reshard_after_forward: bool = (
        True  # free each unit's gathered parameters after forward (less memory, one more all-gather)
    )
    cpu_offload: bool = False  # keep the sharded parameters, gradients and optimizer state in CPU memory


@dataclass
class CheckpointConfig:
    """When to write checkpoints and where to resume from."""

    policy: Literal["none", "final", "periodic"] = "none"  # none | final (at the end) | periodic (+ final)
    dir: Optional[str] = None  # checkpoint directory; null is <run dir>/checkpoints
    path: Optional[str] = (
        None  # the final checkpoint (a directory under parallel=fsdp); null is <dir>/final.ckpt (final.dcp)
    )
    every_n_steps: int = field(default=0, metadata=rule(ge=0, unit="steps"))  # periodic: steps between checkpoints
    keep_last: int = field(default=2, metadata=rule(ge=1))  # periodic: how many step checkpoints to keep
    resume: str = "none"  # none | latest (newest in dir) | a checkpoint file
    export: Literal["none", "safetensors"] = (
        "none"  # safetensors: the final weights as model.safetensors in the run directory
    )


# --- model ------------------------------------------------------------------------------------
@dataclass
class MLPConfig:
    """A multilayer perceptron; its in/out features come from the data."""

    name: Literal["mlp"] = "mlp"
    hidden_features: int = field(default=default_of(MLP, "hidden_features"), metadata=rule(ge=1))  # hidden width
    depth: int = field(default=default_of(MLP, "depth"), metadata=rule(ge=1))  # Linear layers
    init_from: Optional[str] = (
        None  # start from these weights: a clorch checkpoint, a torch state_dict file or .safetensors
    )
    init_strict: bool = True  # init_from must hold exactly the model's keys and shapes


def _gpt_default(name: str) -> Any:
    return default_of(GPTArchitecture, name)


@dataclass
class GPTConfig:
    """A small decoder-only transformer; vocab_size and seq_len come from the data."""

    name: Literal["gpt"] = "gpt"
    n_layer: int = field(default=_gpt_default("n_layer"), metadata=rule(ge=1))  # transformer blocks
    n_head: int = field(default=_gpt_default("n_head"), metadata=rule(ge=1))  # attention heads; must divide d_model
    d_model: int = field(default=_gpt_default("d_model"), metadata=rule(ge=1))  # residual width
    mlp_ratio: float = field(default=_gpt_default("mlp_ratio"), metadata=rule(gt=0))  # MLP width / d_model
    dropout: float = field(default=_gpt_default("dropout"), metadata=rule(ge=0, lt=1))  # dropout probability
    tie_weights: bool = _gpt_default("tie_weights")  # share the embedding and output matrices
    bias: bool = _gpt_default("bias")  # biases in linear layers and layer norms
    vocab_size: Optional[int] = field(default=None, metadata=rule(ge=1))  # null: the data's (256 bytes)
    seq_len: Optional[int] = field(default=None, metadata=rule(ge=1))  # null: the data's
    init_from: Optional[str] = (
        None  # start from these weights: a clorch checkpoint, a torch state_dict file or .safetensors
    )
    init_strict: bool = True  # init_from must hold exactly the model's keys and shapes
    # recompute each block's activations in backward instead of keeping them (less memory, about
    # one more forward of compute); under parallel=ddp and fsdp alike
    activation_checkpointing: bool = False


MODEL_LOAD_KEYS = ("init_from", "init_strict", "activation_checkpointing")
"""Keys of model sections that clorch reads (never passed to the model's class)."""


@dataclass
class TargetModelConfig:
    """A model named by `model._target_` (allow-listed); its other keys are keyword arguments
    (but `init_from` and `init_strict`, which clorch reads as for the built-in models)."""

    target: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    name: str = "custom"
    init_from: Optional[str] = None  # start from these weights (see MLPConfig.init_from)
    init_strict: bool = True  # init_from must hold exactly the model's keys and shapes


# --- data -------------------------------------------------------------------------------------
@dataclass
class SyntheticDataConfig:
    """Regression against a fixed random teacher (for the mlp)."""

    name: Literal["synthetic"] = "synthetic"
    sample_count: int = field(
        default=default_of(SyntheticRegression, "sample_count"), metadata=rule(ge=1)
    )  # training samples
    in_features: int = field(default=default_of(SyntheticRegression, "in_features"), metadata=rule(ge=1))  # input width
    out_features: int = field(
        default=default_of(SyntheticRegression, "out_features"), metadata=rule(ge=1)
    )  # target width
    noise: float = field(
        default=default_of(SyntheticRegression, "noise"), metadata=rule(ge=0)
    )  # std of the target noise


@dataclass
class ArithmeticDataConfig:
    """Generated sums such as 123+456=579 (for the gpt); eval reports exact match."""

    name: Literal["arithmetic"] = "arithmetic"
    sample_count: int = field(
        default=default_of(ArithmeticTask, "sample_count"), metadata=rule(ge=1)
    )  # training samples
    digits: int = field(default=default_of(ArithmeticTask, "digits"), metadata=rule(ge=1, le=9))  # digits per operand
    eval_fraction: float = field(
        default=default_of(ArithmeticTask, "eval_fraction"), metadata=rule(gt=0, lt=1)
    )  # held-out share of the pairs


@dataclass
class TextDataConfig:
    """Byte-level language modelling over a UTF-8 file: data.path=/path/to/file.txt."""

    name: Literal["text"] = "text"
    path: Optional[str] = None  # the UTF-8 file to model (required)
    seq_len: int = field(default=default_of(ByteTextTask, "seq_len"), metadata=rule(ge=2))  # bytes per sample
    sample_count: Optional[int] = field(
        default=default_of(ByteTextTask, "sample_count"), metadata=rule(ge=1)
    )  # windows; null: tile the file
    eval_fraction: float = field(
        default=default_of(ByteTextTask, "eval_fraction"), metadata=rule(gt=0, lt=1)
    )  # held-out tail of the file


@dataclass
class TokensDataConfig:
    """Language modelling over token files: nanoGPT's train.bin/val.bin, or llm.c's .bin files."""

    name: Literal["tokens"] = "tokens"
    train_path: Optional[str] = None  # the training tokens (required)
    eval_path: Optional[str] = None  # the held-out tokens; null holds out the train file's last eval_fraction
    seq_len: int = field(
        default=default_of(TokenFiles, "seq_len"), metadata=rule(ge=1)
    )  # tokens per sample (the model's seq_len follows)
    vocab_size: int = field(
        default=default_of(TokenFiles, "vocab_size"), metadata=rule(ge=1)
    )  # the model's vocabulary; every id must be below it
    dtype: Literal["uint16", "uint32"] = default_of(TokenFiles, "dtype")  # token width of a headerless file
    header: Literal["auto", "none", "llmc"] = default_of(
        TokenFiles, "header"
    )  # auto: llm.c's 256-int32 header when its magic is there
    sample_count: Optional[int] = field(
        default=default_of(TokenFiles, "sample_count"), metadata=rule(ge=1)
    )  # windows; null: every non-overlapping window
    eval_fraction: float = field(
        default=default_of(TokenFiles, "eval_fraction"), metadata=rule(gt=0, lt=1)
    )  # held-out tail without eval_path


@dataclass
class TargetDataConfig:
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


DATA_LOADER_KEYS = tuple(
    f.name for f in dataclasses.fields(TargetDataConfig) if f.name not in ("target", "kwargs", "name")
)
"""Keys of a `data._target_` section that clorch reads; the others go to the dataset's class."""


# --- loss and step ----------------------------------------------------------------------------
@dataclass
class LossConfig:
    """The training loss: the data's own (auto), or a torch loss applied to model(input) and the target."""

    name: Literal["auto", "cross_entropy", "mse"] = (
        "auto"  # auto: the built-in data's loss; cross_entropy: integer class targets (eval adds accuracy)
    )


@dataclass
class FromModelLossConfig:
    """The loss your model computes itself: model(input, target) returns it (nanoGPT, Hugging Face)."""

    name: Literal["from_model"] = "from_model"
    target_arg: Optional[str] = (
        None  # keyword the target is passed as (labels for Hugging Face); null: second positional
    )
    labels: Literal["target", "input"] = (
        "target"  # input: pass the input itself as the target, for models that shift it (HF causal LMs)
    )


@dataclass
class StepConfig:
    """How a batch becomes a loss: auto runs model(input) and the loss; step._target_ names your own."""

    name: Literal["auto"] = "auto"  # auto: model(input), then the loss on (output, target)


@dataclass
class TargetFunctionConfig:
    """A function named by `loss._target_` or `step._target_`; its other keys are keyword arguments."""

    target: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    name: str = "custom"


# --- optimizer and schedule -------------------------------------------------------------------
@dataclass
class AdamWConfig:
    """torch.optim.AdamW."""

    name: Literal["adamw"] = "adamw"
    lr: float = field(default=3e-3, metadata=rule(gt=0))  # peak learning rate
    weight_decay: float = field(default=0.0, metadata=rule(ge=0))  # decoupled weight decay
    # which parameters decay: matrices (>= 2-d; not biases, norms, 1-d) | all
    decay: Decay = source_constant(Optimizers, "DEFAULT_DECAY")
    # clip the gradients' total 2-norm to this (after the all-reduce and unscaling); null: off
    grad_clip: Optional[float] = field(default=None, metadata=rule(gt=0))
    betas: list[float] = field(
        default_factory=lambda: list(source_constant(Optimizers, "ADAMW_BETAS")),  # moment decays
        metadata=rule(length=2, items=rule(ge=0, lt=1), words="in [0, 1)"),
    )
    fused: Optional[bool] = None  # fused kernels; null: fused when every parameter is on CUDA


@dataclass
class SGDConfig:
    """torch.optim.SGD with momentum."""

    name: Literal["sgd"] = "sgd"
    lr: float = field(default=1e-2, metadata=rule(gt=0))  # peak learning rate
    weight_decay: float = field(default=0.0, metadata=rule(ge=0))  # L2 penalty
    # which parameters decay: matrices (>= 2-d; not biases, norms, 1-d) | all
    decay: Decay = source_constant(Optimizers, "DEFAULT_DECAY")
    # clip the gradients' total 2-norm to this (after the all-reduce and unscaling); null: off
    grad_clip: Optional[float] = field(default=None, metadata=rule(gt=0))
    momentum: float = field(
        default=source_constant(Optimizers, "SGD_MOMENTUM"), metadata=rule(ge=0, lt=1)
    )  # momentum factor
    fused: Optional[bool] = None  # fused kernels; null: fused when every parameter is on CUDA


@dataclass
class ConstantScheduleConfig:
    """Constant learning rate after an optional linear warmup."""

    name: Literal["constant"] = "constant"
    warmup_steps: int = field(default=0, metadata=rule(ge=0, unit="steps"))  # linear warmup


@dataclass
class CosineScheduleConfig:
    """Linear warmup, then cosine decay to min_lr_ratio * lr."""

    name: Literal["cosine"] = "cosine"
    warmup_steps: int = field(
        default=source_constant(Schedules, "COSINE_WARMUP_STEPS"), metadata=rule(ge=0, unit="steps")
    )  # linear warmup
    min_lr_ratio: float = field(
        default=source_constant(Schedules, "COSINE_MIN_LR_RATIO"), metadata=rule(ge=0, le=1)
    )  # floor / peak lr


# --- launcher and logger ----------------------------------------------------------------------
@dataclass
class LocalLauncherConfig:
    """clorch.distributed.launch on this machine (one node, or one launcher per node)."""

    name: Literal["local"] = "local"
    nproc_per_node: Union[Literal["auto"], int] = field(
        default="auto", metadata=rule(ge=1)
    )  # ranks on this node; auto: one per GPU, or 2 on CPU
    devices: Optional[list[int]] = None  # CUDA device indices, one per local rank, e.g. [0,1]
    timeout: Optional[float] = field(
        default=default_of(launch, "timeout"), metadata=rule(gt=0, le=YEAR, unit="seconds")
    )  # whole-job limit; null: none
    nnodes: int = field(default=default_of(launch, "nnodes"), metadata=rule(ge=1))  # nodes in the job
    node_rank: int = field(default=default_of(launch, "node_rank"), metadata=rule(ge=0))  # this node's index
    master_addr: str = default_of(launch, "master_addr")  # rendezvous host
    master_port: Optional[int] = field(
        default=default_of(launch, "master_port"), metadata=rule(ge=1, le=65535)
    )  # null picks a free port
    max_restarts: int = field(
        default=default_of(launch, "max_restarts"), metadata=rule(ge=0)
    )  # restart a failed job, resuming from latest
    rdzv_timeout: float = field(
        default=default_of(launch, "rdzv_timeout"), metadata=rule(gt=0, le=YEAR, unit="seconds")
    )  # nnodes > 1: wait this long for the other nodes
    collective_timeout: float = field(
        default=default_of(launch, "collective_timeout"), metadata=rule(gt=0, le=YEAR, unit="seconds")
    )  # a rank stuck this long in one collective fails the job


@dataclass
class TorchrunLauncherConfig:
    """torch's elastic agent (torchrun) on this node: c10d rendezvous, restarts, several nodes.

    Start the same command on every node; they meet at rdzv_endpoint.
    """

    name: Literal["torchrun"] = "torchrun"
    nproc_per_node: Union[Literal["auto"], int] = field(default="auto", metadata=rule(ge=1))  # ranks on this node
    nnodes: Union[int, str] = 1  # nodes in the job, or "MIN:MAX" for an elastic range
    rdzv_endpoint: str = "127.0.0.1:29400"  # HOST:PORT of the c10d rendezvous (the first node)
    rdzv_id: str = "clorch"  # the job's id, the same on every node
    rdzv_timeout: float = field(
        default=900.0, metadata=rule(gt=0, le=YEAR, unit="seconds")
    )  # wait this long for the nodes
    max_restarts: int = field(default=0, metadata=rule(ge=0))  # restart the ranks, resuming from latest
    collective_timeout: float = field(
        default=default_of(launch, "collective_timeout"), metadata=rule(gt=0, le=YEAR, unit="seconds")
    )  # a rank stuck this long in one collective fails the job


TRACKERS = ("mlflow", "wandb")


@dataclass
class LoggerConfig:
    """metrics.jsonl from rank 0 (always written); TensorBoard event files and experiment trackers optionally."""

    name: Literal["jsonl", "tensorboard", "mlflow", "wandb"] = "jsonl"
    tensorboard: bool = False  # also write TensorBoard event files (needs the tensorboard extra)
    progress: Literal["auto", "bar", "lines", "off"] = "auto"  # auto: a bar on a terminal, else lines
    trackers: list[Literal[TRACKERS]] = field(
        default_factory=list
    )  # experiment trackers the run's metrics go to: mlflow, wandb
    experiment: Optional[str] = (
        None  # the MLflow experiment and W&B project; null: $MLFLOW_EXPERIMENT_NAME / $WANDB_PROJECT, else clorch
    )
    tracking_uri: Optional[str] = (
        None  # MLflow's store or server; null: $MLFLOW_TRACKING_URI, else sqlite mlflow.db beside outputs/
    )
    mode: Literal["auto", "online", "offline", "disabled"] = "auto"  # W&B: auto is online when logged in, else offline


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


OPTIONS: dict[str, dict[str, Any]] = {
    "precision": {"fp32": FP32Config(), "bf16": BF16Config(), "fp16": FP16Config()},
    "sampler": {"distributed": SamplerConfig()},
    "ddp": {"default": DDPConfig()},
    "parallel": {"ddp": DDPParallelConfig(), "fsdp": FSDPParallelConfig()},
    "checkpoint": {
        "none": CheckpointConfig(),
        "final": CheckpointConfig(policy="final"),
        "periodic": CheckpointConfig(policy="periodic", every_n_steps=50),
    },
    "model": {"mlp": MLPConfig(), "gpt": GPTConfig()},
    "data": {
        "synthetic": SyntheticDataConfig(),
        "arithmetic": ArithmeticDataConfig(),
        "text": TextDataConfig(),
        "tokens": TokensDataConfig(),
    },
    "optim": {"adamw": AdamWConfig(), "sgd": SGDConfig()},
    "schedule": {"constant": ConstantScheduleConfig(), "cosine": CosineScheduleConfig()},
    "launcher": {"local": LocalLauncherConfig(), "torchrun": TorchrunLauncherConfig()},
    "logger": {
        "jsonl": LoggerConfig(),
        "tensorboard": LoggerConfig(name="tensorboard", tensorboard=True),
        "mlflow": LoggerConfig(name="mlflow", trackers=["mlflow"]),
        "wandb": LoggerConfig(name="wandb", trackers=["wandb"]),
    },
    "preflight": {"default": PreflightConfig()},
    "loss": {
        "auto": LossConfig(),
        "cross_entropy": LossConfig(name="cross_entropy"),
        "mse": LossConfig(name="mse"),
        "from_model": FromModelLossConfig(),
    },
    "step": {"auto": StepConfig()},
}
"""Config group -> option name -> that option's values (an instance of its schema)."""

BACKENDS = ("auto", "gloo", "nccl")
"""The `backend` group's options: each sets the top-level `backend` key."""

CUSTOM = "custom"
TARGET_GROUPS = ("model", "data", "loss", "step")
"""Groups whose section may name the user's own class or function with `_target_`: setting it
selects the option `custom` (no built-in keys), so the section holds just the target and its
arguments (and, for model and data, the keys clorch reads: MODEL_LOAD_KEYS, DATA_LOADER_KEYS)."""

SHORTHAND = {"preflight": "mode", "loss": "name"}
"""Sections whose one key may be given as the section's value: `preflight=only` (or a recipe's
`preflight: only`) is `preflight.mode=only`, as a user of the option expects to write it."""

SELECTOR = {"checkpoint": "policy"}
"""The key that names a group's option inside it ("name" unless listed here; ddp has one option)."""


def option_schemas(group: str) -> dict[str, type]:
    """Option name -> schema class for a group."""
    return {name: type(values) for name, values in OPTIONS[group].items()}


# --- the whole config, as the engine reads it ---------------------------------------------------
PrecisionOption = Union[FP32Config, BF16Config, FP16Config]
ModelOption = Union[MLPConfig, GPTConfig, TargetModelConfig]
DataOption = Union[SyntheticDataConfig, ArithmeticDataConfig, TextDataConfig, TokensDataConfig, TargetDataConfig]
OptimOption = Union[AdamWConfig, SGDConfig]
ScheduleOption = Union[ConstantScheduleConfig, CosineScheduleConfig]


@dataclass
class TrainConfig(TopConfig):
    """A whole validated config: the top-level keys and one option per group."""

    precision: PrecisionOption = field(default_factory=BF16Config)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    ddp: DDPConfig = field(default_factory=DDPConfig)
    parallel: Union[DDPParallelConfig, FSDPParallelConfig] = field(default_factory=DDPParallelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    model: ModelOption = field(default_factory=MLPConfig)
    data: DataOption = field(default_factory=SyntheticDataConfig)
    optim: OptimOption = field(default_factory=AdamWConfig)
    schedule: ScheduleOption = field(default_factory=ConstantScheduleConfig)
    launcher: Union[LocalLauncherConfig, TorchrunLauncherConfig] = field(default_factory=LocalLauncherConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    preflight: PreflightConfig = field(default_factory=PreflightConfig)
    loss: Union[LossConfig, FromModelLossConfig, TargetFunctionConfig] = field(default_factory=LossConfig)
    step: Union[StepConfig, TargetFunctionConfig] = field(default_factory=StepConfig)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TrainConfig":
        """Build from a composed, *validated* config (plain containers; see clorch.config.checks).

        Raises:
            KeyError, TypeError: `values` was not validated (a missing or unknown key).
        """
        groups = {group: section_from_dict(group, values[group]) for group in OPTIONS}
        top = {f.name: values[f.name] for f in dataclasses.fields(TopConfig)}
        return cls(**top, **groups)

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


TARGET_SCHEMAS = {
    "model": TargetModelConfig,
    "data": TargetDataConfig,
    "loss": TargetFunctionConfig,
    "step": TargetFunctionConfig,
}
"""The schema of a group's section when it names `_target_`."""


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
    options = OPTIONS[group]
    values = {k: v for k, v in values.items() if k != "_target_"}  # reported by the checks elsewhere
    selector = SELECTOR.get(group, "name")
    sample = next(iter(options.values()))
    cls = type(options[values[selector]]) if hasattr(sample, selector) else type(sample)
    values = dict(values)
    if cls is FP16Config:
        values["scaler"] = ScalerConfig(**values["scaler"])
    return cls(**values)
