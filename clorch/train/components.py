"""Build everything one rank trains with from the config: `build_components(cfg, ctx, total_steps)`.

Also usable in-process (a benchmark at world size 1): `ctx` only needs
`rank` and `world_size`, and the process group must already be initialized
when world_size > 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import nn

from clorch.amp import MixedPrecision
from clorch.builders.data import build_splits
from clorch.builders.optimizer import build_optimizer
from clorch.builders.rank_model import ModelBuilder
from clorch.config.options.chunked_loss import ChunkedCrossEntropyConfig
from clorch.config.layout import ParallelLayout
from clorch.config.schema import CUDA_GRAPH_MODES, TrainConfig
from clorch.data import DistributedSampler
from clorch.data.base import derive_seed
from clorch.data.fused_loss import FusedLossTask
from clorch.data.placement import place_task
from clorch.distributed import device, is_initialized
from clorch.optim import build_scheduler
from clorch.strategies import ExactDDPStrategy, ExactFSDPStrategy, Strategy, adopt, strategy_class
from clorch.strategies.base import compile_mode_arg  # noqa: F401  (clorch-bench runner reads it here)


@dataclass
class Components:
    """One rank's training objects. `strategy` is the `parallel` mode's (`clorch.strategies`):
    the loop, evaluation, checkpoints and export ask it what differs between modes. `model`
    is what the loop calls forward on (DDP's wrapper, or under parallel=fsdp a
    `ShardedTrainer`); `raw_model` is what it wraps, before torch.compile (checkpoints and
    evaluation use it; sharded, its parameters are DTensor shards).

    `precision` (a `clorch.amp.MixedPrecision`) owns autocast, the loss scaler,
    backward and the optimizer step; `scaler` and `autocast_dtype` read it.
    """

    model: Any  # clorch.nn.parallel.DistributedDataParallel, or a ShardedTrainer (parallel=fsdp)
    raw_model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any  # torch.optim.lr_scheduler.LRScheduler
    task: Any  # training split (clorch.data.tasks.Task)
    eval_task: Any  # held-out split
    sampler: Any  # clorch.data.DistributedSampler
    device: torch.device
    batch_size: int  # samples per micro-batch per rank
    accumulation: int  # micro-batches per optimizer step
    precision: MixedPrecision
    rank: int = 0
    world_size: int = 1
    cuda_graphs: bool = False  # the compiled model replays CUDA graphs (compile_mode reduce-overhead, max-autotune)
    grad_clip: float | None = None  # max total 2-norm of the gradients (optim.grad_clip); None: not clipped
    # the parallel mode's; set up, it holds model, raw_model and optimizer (None: adopted from them)
    strategy: Strategy | None = None

    def __post_init__(self) -> None:
        if self.strategy is None:  # components built by hand around a wrapped model
            self.strategy = adopt(
                self.model, self.raw_model, self.optimizer, self.precision, self.device, self.rank, self.world_size
            )

    @property
    def scaler(self) -> Any:
        """The loss scaler (clorch.amp.GradScaler), or None without fp16: `precision.scaler`.
        Checkpoints save and restore it."""
        return self.precision.scaler

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The dtype forward passes run in, or None for fp32 (no autocast): `precision.autocast_dtype`."""
        return self.precision.autocast_dtype

    @property
    def pin_memory(self) -> bool:
        """Pinned host batches make the host-to-device copy asynchronous."""
        return self.device.type == "cuda"

    def autocast(self):
        """The autocast context for forward passes (a pass-through for fp32): `precision.autocast()`."""
        return self.precision.autocast()


def _device(ctx: Mapping[str, Any]) -> torch.device:
    if is_initialized():
        return device()
    return torch.device("cuda", torch.cuda.current_device()) if ctx.get("backend") == "nccl" else torch.device("cpu")


def build_tasks(cfg: TrainConfig, device_type: str = "cpu") -> tuple[Any, Any]:
    """The train and eval splits of `cfg.data` (a dataset of yours loads for `device_type`)."""
    return build_splits(cfg, device_type)


# derive_seed's stream of the draws made while training (dropout), one per rank: (TRAINING_STREAM,
# rank + 1). Data streams are small numbers (and epochs); numpy's SeedSequence ignores trailing
# zero words, so a rank of 0 as the last word would give rank 0 the stream (seed, TRAINING_STREAM).
TRAINING_STREAM = 0x7EED_0001


def seed_training_draws(seed: int, rank: int) -> None:
    """Seed torch's generators (CPU and every CUDA device) for the random draws of training.

    Called after the model is built, which draws from `seed` itself on every
    rank alike: the weights are the same everywhere, while dropout masks and
    any other draw in the forward differ by rank (as nanoGPT's seed + rank),
    from a stream of `seed` of its own (`training_seed(seed, rank)`), so
    rank 1's draws never repeat a run's at seed + 1 nor a data stream. Local.
    Checkpoints hold each rank's generator states, so a resume continues
    the same streams.
    """
    torch.manual_seed(training_seed(seed, rank))


def training_seed(seed: int, rank: int) -> int:
    """The seed of rank `rank`'s draws while training, derived from the run's `seed`."""
    return derive_seed(seed, TRAINING_STREAM, rank + 1)


def _scheduler(cfg: TrainConfig, optimizer: torch.optim.Optimizer, total_steps: int) -> Any:
    return build_scheduler(optimizer, cfg.schedule.name, **cfg.schedule.kwargs(total_steps))


def replays_cuda_graphs(compiled: bool, mode: str, device: torch.device) -> bool:
    """Whether a model (`compiled` or not, with compile_mode `mode`) replays CUDA graphs on `device`."""
    return compiled and mode in CUDA_GRAPH_MODES and device.type == "cuda"


def _placed_tasks(cfg: TrainConfig, device: torch.device) -> tuple[Any, Any]:
    """The train and eval splits on `device`, the train split's loss compiled or fused as asked."""
    task, eval_task = build_tasks(cfg, device.type)
    for split in (task, eval_task):
        place_task(split, device)  # a GPU gathers batches from its own copy: no per-batch pinning
    if cfg.compile and hasattr(task, "compile_loss"):
        task.compile_loss = cfg.compile_mode  # the loss is compiled too: fused float32 log-softmax
    if isinstance(cfg.loss, ChunkedCrossEntropyConfig):
        task = FusedLossTask(task)  # model(input, target=...) returns the loss; eval is the task's own
    return task, eval_task


def _sampler(cfg: TrainConfig, size: int, rank: int, world: int) -> DistributedSampler:
    """This rank's sampler over the `size` training samples (`cfg.sampler`; its seed defaults to the run's)."""
    sampling = cfg.sampler
    return DistributedSampler(
        size,
        num_replicas=world,
        rank=rank,
        seed=cfg.seed if sampling.seed is None else sampling.seed,
        shuffle=sampling.shuffle,
        drop_last=sampling.drop_last,
        # exact=true: each rank reads whole micro-batches of the step, the same ones on any world size
        block_size=cfg.batch_size * cfg.accumulation if cfg.exact else 1,
    )


def _strategy_class(cfg: TrainConfig) -> type:
    """The strategy `parallel` names; under exact=true its exact counterpart (ddp or fsdp, the checks say)."""
    if cfg.exact:
        return ExactFSDPStrategy if cfg.parallel.name == "fsdp" else ExactDDPStrategy
    return strategy_class(cfg.parallel)


def build_components(
    cfg: TrainConfig, ctx: Mapping[str, Any], total_steps: int, layout: ParallelLayout | None = None
) -> Components:
    """Build task, model (on the rank's device, compiled if asked, placed on the ranks by the
    strategy `parallel` names), optimizer, schedule, precision (autocast and scaler) and sampler from a
    checked config. `total_steps` is the plan's (the cosine schedule's length).

    Every rank must call it: wrapping in DDP is a synchronization point (it checks
    parameter signatures and broadcasts rank 0's weights; see DistributedDataParallel),
    and so is sharding (fully_shard over the job's ranks).

    Raises:
        ValueError, TypeError: the builders reject a setting (the checks catch most first).
    """
    rank, world = int(ctx.get("rank", 0)), int(ctx.get("world_size", 1))
    layout = cfg.parallel.layout(world) if layout is None else layout  # the plan's, where there is one
    device = _device(ctx)
    task, eval_task = _placed_tasks(cfg, device)
    # fp16's scaler from `precision.scaler`; one object, which the strategy steps through
    precision = MixedPrecision(
        cfg.precision.runs_as or cfg.precision.name, device, scaler=cfg.precision.scaler_settings()
    )
    # parallel=ddp or fsdp: the option names its strategy class, which places the model on the ranks
    strategy = _strategy_class(cfg).from_config(cfg, precision, device, rank, world)
    source = ModelBuilder(cfg, task, float8_all_gather=cfg.parallel.float8_all_gather(cfg.precision))
    strategy.setup(source, lambda model: build_optimizer(cfg, model))
    raw, model, optimizer = strategy.raw_model, strategy.model, strategy.optimizer
    seed_training_draws(cfg.seed, rank)
    return Components(
        model=model,
        raw_model=raw,
        optimizer=optimizer,
        scheduler=_scheduler(cfg, optimizer, total_steps),
        precision=precision,
        task=task,
        eval_task=eval_task,
        # which share of the data this rank reads: its place among the data-parallel ranks
        sampler=_sampler(cfg, len(task), layout.dp_rank(rank), layout.dp_size),
        device=device,
        batch_size=cfg.batch_size,
        accumulation=cfg.accumulation,
        rank=rank,
        world_size=world,
        grad_clip=cfg.optim.grad_clip,
        cuda_graphs=replays_cuda_graphs(cfg.compile, cfg.compile_mode, device),
        strategy=strategy,
    )
