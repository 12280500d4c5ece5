"""The launch plan's checks that need more than the config: this machine, the data's sizes,
the filesystem. Each returns error messages (naming the key, the value and what is allowed)
and runs only on the sections of the config that are valid (`clorch.config.checks.complete`),
so that `clorch.plan.plan` reports every error in one go.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from clorch._files import unwritable
from clorch.config.checks import complete, reused_dir_errors
from clorch.plan.data import model_sizes_of
from clorch.plan.model import build_model_for
from clorch.config.schema import BACKENDS, GPTConfig, TrainConfig
from clorch.launch.config import check_nodes
from clorch.launch.gpus import resolve_ranks


def top_backend(cfg: Any) -> str | None:
    """The top-level backend, also when another top-level key has an error (so that an
    unusable backend is still reported beside it)."""
    backend = cfg.backend if complete(cfg, "top") else getattr(cfg, "raw", {}).get("backend")
    return backend if backend in BACKENDS else None


def local_ranks(launcher: Any, backend: str, problems: list[str]) -> tuple[int, list[int] | None, str]:
    nproc = None if launcher.nproc_per_node == "auto" else launcher.nproc_per_node
    devices = getattr(launcher, "devices", None)  # the torchrun launcher places ranks itself
    before = len(problems)
    count, cuda, name = resolve_ranks(nproc, devices, backend, os.environ, problems)
    for i in range(before, len(problems)):  # the launcher names its arguments bare, in Python
        text = problems[i].replace("devices=None", "launcher.devices=null")
        problems[i] = f"launcher.{text}" if text.startswith(("devices", "nproc")) else f"backend={backend}: {text}"
    if cuda is None:
        return count, None, name or "gloo"
    return count, devices if devices is not None else list(range(len(cuda))), name or "nccl"


def min_nodes(nnodes: int | str) -> int:
    """The smallest node count of `launcher.nnodes` (N, or "MIN:MAX" for torchrun)."""
    try:
        return int(str(nnodes).split(":")[0])
    except ValueError:
        return 1  # reported by the config checks


def drop_last(cfg: Any) -> bool | None:
    """sampler.drop_last, also from a sampler section that has errors in its other keys."""
    if cfg.sampler is not None:
        return cfg.sampler.drop_last
    value = (getattr(cfg, "raw", {}).get("sampler") or {}).get("drop_last")
    return value if isinstance(value, bool) else None


def plan_steps(cfg: TrainConfig, size: int, world: int) -> tuple[int, int, int]:
    """(samples per rank per epoch, optimizer steps per epoch, steps in the run).

    A step takes batch_size * accumulation of the rank's samples; the epoch's last
    step takes what is left, so an epoch is ceil(shard / (batch_size * accumulation)) steps.
    """
    shard = size // world if drop_last(cfg) else math.ceil(size / world)
    steps_per_epoch = max(1, math.ceil(shard / (cfg.batch_size * cfg.accumulation)))
    return shard, steps_per_epoch, cfg.max_steps or cfg.epochs * steps_per_epoch


def data_errors(cfg: TrainConfig, train: int, held_out: int, world: int) -> list[str]:
    errors = []
    shard = plan_steps(cfg, train, world)[0]
    if cfg.batch_size > shard:
        errors.append(
            f"batch_size={cfg.batch_size} is larger than a rank's shard: "
            f"{train} training samples over {world} ranks give {shard} per rank "
            f"(use batch_size <= {shard}, more data, or fewer ranks)"
        )
    if held_out < world:
        errors.append(
            f"data={cfg.data.name}: the eval split has {held_out} sample(s), fewer than "
            f"the job's {world} ranks (every rank evaluates at least one): raise "
            f"data.sample_count or data.eval_fraction, or use fewer ranks"
        )
    return errors


def model_errors(cfg: TrainConfig) -> list[str]:
    """A GPT sized smaller than the data's samples or vocabulary."""
    if not isinstance(cfg.model, GPTConfig):
        return []
    needed = model_sizes_of(cfg)
    errors = []
    for key in ("seq_len", "vocab_size"):
        value = getattr(cfg.model, key)
        if value is not None and key in needed and value < needed[key]:
            errors.append(
                f"model.{key}={value} is smaller than data={cfg.data.name}'s "
                f"{needed[key]}: use model.{key} >= {needed[key]}, or null (the data's)"
            )
    return errors


def token_file_errors(cfg: TrainConfig) -> list[str]:
    """data=tokens: an id at or above data.vocab_size in a token file (which would index past
    the model's embedding on some rank, mid-run). Reads each file once, in chunks."""
    # lazy: clorch.data.tokens imports torch, kept out of clorch-train's start
    from clorch.data.tokens import largest_token

    data = cfg.data
    if data.name != "tokens":
        return []
    errors = []
    for key in ("train_path", "eval_path"):
        path = getattr(data, key)
        if path is None:
            continue
        largest = largest_token(path, data.dtype, data.header)
        if largest >= data.vocab_size:
            errors.append(
                f"data.{key}={path!r} holds token id {largest}, not below data.vocab_size="
                f"{data.vocab_size}: set data.vocab_size > {largest} (or check data.dtype)"
            )
    return errors


RANKS_PER_CPU = 4  # more CPU ranks than this per core is a typo, not a plan
# Bytes a parameter costs during training: fp32 weight, gradient, two AdamW moments.
TRAINING_BYTES_PER_PARAMETER = 16


def rank_count_errors(nproc: int, backend: str) -> list[str]:
    """CPU ranks far beyond this machine's cores (GPU ranks are checked against the GPUs)."""
    cores = os.cpu_count() or 1
    if backend == "gloo" and nproc > RANKS_PER_CPU * cores:
        return [
            f"launcher.nproc_per_node={nproc} is far more ranks than this machine's {cores} CPU "
            f"core(s) can run (at most {RANKS_PER_CPU * cores}, {RANKS_PER_CPU} per core)"
        ]
    return []


def node_errors(launcher: Any) -> list[str]:
    """The local launcher's node layout, checked as `launch()` will check it (names prefixed)."""
    if launcher.name != "local":
        return []

    problems: list[str] = []
    check_nodes(
        {
            "nnodes": launcher.nnodes,
            "node_rank": launcher.node_rank,
            "master_addr": launcher.master_addr,
            "master_port": launcher.master_port,
        },
        problems,
    )
    return [f"launcher.{p}".replace("got None", "got null") for p in problems]


def _available_memory() -> int | None:
    """Bytes of memory available now (Linux: MemAvailable), or None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_errors(cfg: TrainConfig, ranks_here: int, backend: str) -> list[str]:
    """A model whose training state cannot fit: the CPU ranks' copies in this machine's memory.
    Sized on the meta device (no memory allocated). GPU memory is not checked here: asking
    for it would start CUDA in the launching process; a rank reports CUDA's own out-of-memory."""
    # lazy: keeps torch out of clorch-train's start
    import torch

    if backend == "nccl":
        return []
    try:
        sizes = model_sizes_of(cfg)  # on the host: a task may draw samples
        with torch.device("meta"):
            params = sum(p.numel() for p in build_model_for(cfg, sizes).parameters())
    except Exception:  # a user model that cannot be built on the meta device: not checked here
        return []
    need, have = params * TRAINING_BYTES_PER_PARAMETER * ranks_here, _available_memory()
    if have is None or need <= have:
        return []
    return [
        f"model={cfg.model.name}: {params:,} parameters need about {need / 2**30:.1f} GiB to train "
        f"({TRAINING_BYTES_PER_PARAMETER} bytes each: weights, gradients, optimizer state, per rank), "
        f"more than the memory available for {ranks_here} rank(s) ({have / 2**30:.1f} GiB)"
    ]


def schedule_errors(cfg: TrainConfig, total: int) -> list[str]:
    schedule = cfg.schedule
    if schedule.name == "cosine" and total <= schedule.warmup_steps:
        return [
            f"schedule.warmup_steps={schedule.warmup_steps} must be < the run's "
            f"{total} optimizer steps for schedule=cosine"
        ]
    return []


def path_errors(cfg: TrainConfig, run_dir: Path | None) -> list[str]:
    """Directories the run would write and cannot (probed by creating a file)."""
    ckpt, errors = cfg.checkpoint, []
    targets = []
    if run_dir is not None:
        targets.append(("the run directory", run_dir))
    if ckpt.policy != "none":
        directory = Path(ckpt.dir).expanduser() if ckpt.dir else None
        if directory is not None:
            targets.append((f"checkpoint.dir={ckpt.dir}", directory))
        if ckpt.path is not None:
            targets.append((f"checkpoint.path={ckpt.path}", Path(ckpt.path).expanduser().parent))
    for what, directory in targets:
        problem = unwritable(directory)
        if problem:
            errors.append(f"{what}: cannot write there ({problem}); choose a writable location")
    if run_dir is not None and ckpt.dir is None and ckpt.policy == "periodic" and ckpt.resume == "none":
        # A reused run directory must not mix two runs' step checkpoints.
        errors += reused_dir_errors("checkpoint.dir", run_dir / "checkpoints")
    return errors


def external_ranks(cfg: Any, external: Any, problems: list[str]) -> tuple[int, list[int] | None, str]:
    """Ranks as the external launcher placed them: this node's count, this rank's device."""
    # lazy: clorch.distributed.groups imports torch, kept out of clorch-train's start
    from clorch.distributed.groups import resolve_backend

    try:
        backend = resolve_backend(cfg.backend)
    except ValueError as exc:
        problems.append(f"backend={cfg.backend}: {exc}")
        backend = "gloo"
    devices = [external.env.local_rank] if backend == "nccl" else None
    return external.env.local_world_size, devices, backend
