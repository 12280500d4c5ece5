"""The launch plan's checks that need more than the config: this machine, the data's sizes,
the filesystem. Each returns error messages (naming the key, the value and what is allowed)
and runs only on the sections of the config that are valid (`clorch.config.checks.complete`),
so that `clorch.plan.plan` reports every error in one go.
"""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path
from typing import Any

from clorch._files import unwritable
from clorch.config.checks import complete, reused_dir_errors
from clorch.config.layout import ParallelLayout
from clorch.builders.data import model_sizes_of
from clorch.plan.memory import RankMemory, bytes_per_parameter, config_memory, human_bytes
from clorch.builders.model import build_model_for
from clorch.config.schema import BACKENDS, GPTConfig, TrainConfig
from clorch.launch.config import check_nodes
from clorch.launch.gpus import resolve_ranks, visible_gpus
from clorch.plan.where import Machine
from clorch.plan.interrupted import reraise_interrupt


def top_backend(cfg: Any) -> str | None:
    """The top-level backend, also when another top-level key has an error (so that an
    unusable backend is still reported beside it)."""
    backend = cfg.backend if complete(cfg, "top") else getattr(cfg, "raw", {}).get("backend")
    return backend if backend in BACKENDS else None


def local_ranks(
    launcher: Any, backend: str, problems: list[str], machine: Machine
) -> tuple[int, list[int] | None, str]:
    """Ranks as clorch's launcher places them on a node of `machine`: (count, devices, backend)."""
    nproc = None if launcher.nproc_per_node == "auto" else launcher.nproc_per_node
    devices = getattr(launcher, "devices", None)  # the torchrun launcher places ranks itself
    before = len(problems)
    count, cuda, name = resolve_ranks(nproc, devices, backend, machine.environ(nproc, devices), problems)
    for i in range(before, len(problems)):  # the launcher names its arguments bare, in Python
        text = machine.phrase(problems[i].replace("devices=None", "launcher.devices=null"))
        problems[i] = f"launcher.{text}" if text.startswith(("devices", "nproc")) else f"backend={backend}: {text}"
    if cuda is None:
        return count, None, name or "gloo"
    return count, devices if devices is not None else list(range(len(cuda))), name or "nccl"


def plugin_ranks(backend: str, problems: list[str], machine: Machine) -> tuple[int, list[int] | None, str]:
    """Ranks as a Hydra launcher plugin starts them (more than one task a node, each task a rank,
    on its local rank's GPU under nccl): (count a node, devices, backend)."""
    tasks, gpus = machine.tasks_per_node, len(machine.gpus or ())
    resolved = ("nccl" if gpus else "gloo") if backend == "auto" else backend
    if resolved == "nccl" and gpus < tasks:
        problems.append(
            f"backend={backend}: hydra.launcher.tasks_per_node={tasks} starts {tasks} ranks a node, each on a "
            f"GPU of its own under nccl, but {machine.where} has {gpus}: ask for {tasks} GPUs a node, or "
            "use backend=gloo for CPU ranks"
        )
    return tasks, list(range(tasks)) if resolved == "nccl" else None, resolved


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


def plan_steps(cfg: TrainConfig, size: int, layout: ParallelLayout) -> tuple[int, int, int]:
    """(samples per rank per epoch, optimizer steps per epoch, steps in the run).

    The `size` samples are split over the layout's data-parallel ranks (`dp_size`). A step
    takes batch_size * accumulation of the rank's samples; the epoch's last step takes what
    is left, so an epoch is ceil(shard / (batch_size * accumulation)) steps.
    """
    readers = layout.dp_size
    shard = size // readers if drop_last(cfg) else math.ceil(size / readers)
    steps_per_epoch = max(1, math.ceil(shard / (cfg.batch_size * cfg.accumulation)))
    return shard, steps_per_epoch, cfg.max_steps or cfg.epochs * steps_per_epoch


def data_errors(cfg: TrainConfig, train: int, held_out: int, layout: ParallelLayout) -> list[str]:
    """A rank's share of the training data smaller than a batch; an eval split smaller than the
    data-parallel ranks (each evaluates its own share)."""
    errors = []
    readers = layout.dp_size
    shard = plan_steps(cfg, train, layout)[0]
    if cfg.batch_size > shard:
        errors.append(
            f"batch_size={cfg.batch_size} is larger than a rank's shard: "
            f"{train} training samples over {readers} ranks give {shard} per rank "
            f"(use batch_size <= {shard}, more data, or fewer ranks)"
        )
    if held_out < readers:
        errors.append(
            f"data={cfg.data.name}: the eval split has {held_out} sample(s), fewer than "
            f"the job's {readers} ranks (every rank evaluates at least one): raise "
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


def rank_count_errors(nproc: int, backend: str, machine: Machine) -> list[str]:
    """CPU ranks far beyond this machine's cores (GPU ranks are checked against the GPUs; the
    cores of another machine by its ranks)."""
    cores = os.cpu_count() or 1
    if backend == "gloo" and machine.hardware_here and nproc > RANKS_PER_CPU * cores:
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


def _gpu_memory(launcher: Any, ranks_here: int) -> int | None:
    """The smallest total memory of the GPUs this node's ranks use, from `nvidia-smi` (so that
    CUDA never starts in the launching process); None where that cannot be read."""
    visible = visible_gpus(os.environ)
    indices = getattr(launcher, "devices", None) or range(ranks_here)
    return gpu_total_memory([visible[i] for i in indices if i < len(visible)])


def gpu_total_memory(ids: list[str]) -> int | None:
    """The smallest total memory of the GPUs `ids` (CUDA_VISIBLE_DEVICES entries), from `nvidia-smi`;
    None where that cannot be read."""
    if not ids:
        return None
    query = ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", ",".join(ids)]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    mib = [int(v) for v in out.split() if v.isdigit()]
    return min(mib) * 2**20 if mib else None


def too_large(memory: RankMemory, ranks_here: int, gpu: int | None, host: int | None) -> list[str]:
    """Where `memory` does not fit, one phrase for each (empty: it fits): the GPU (`gpu` bytes
    each; None: CPU ranks, or not known) and the host (`host` bytes available for this node's
    `ranks_here` ranks; None: not known)."""
    found = []
    if gpu is not None and not memory.cpu_ranks and memory.device > gpu:
        found.append(f"{human_bytes(memory.device)} of GPU memory per rank, more than the GPU's {human_bytes(gpu)}")
    if host is not None and memory.host * ranks_here > host:
        node = (
            f" ({human_bytes(memory.host * ranks_here)} for this node's {ranks_here} ranks)" if ranks_here > 1 else ""
        )
        found.append(
            f"{human_bytes(memory.host)} of host memory per rank{node}, more than the {human_bytes(host)} available"
        )
    return found


def _alternative(
    cfg: TrainConfig, model: Any, layout: ParallelLayout, cpu: bool, ranks_here: int, gpu: int | None, host: int | None
) -> str:
    """What parallel=fsdp (and its cpu_offload) would need per rank, and whether it fits."""
    sharded, world = layout.sharded, layout.world_size
    plain = config_memory(cfg, model, world, sharded=True, cpu_offload=False, cpu_ranks=cpu)
    offload = config_memory(cfg, model, world, sharded=True, cpu_offload=True, cpu_ranks=cpu)
    fsdp = f"parallel=fsdp over the job's {world} rank(s)"
    need = f"{human_bytes(plain.host)} of host memory" if cpu else f"{human_bytes(plain.device)} of GPU memory"
    if not sharded and not too_large(plain, ranks_here, gpu, host):
        return f"; {fsdp} would need about {need} per rank ({plain.describe()}): use parallel=fsdp"
    if not cpu and not (sharded and cfg.parallel.cpu_offload) and not too_large(offload, ranks_here, gpu, host):
        return (
            f"; {fsdp} with parallel.cpu_offload=true would need about {human_bytes(offload.device)} of GPU memory "
            f"and {human_bytes(offload.host)} of host memory per rank: use parallel=fsdp parallel.cpu_offload=true"
        )
    alone = "" if sharded else f"; {fsdp} would still need about {need} per rank"
    lighter = ""
    if plain.activations * 10 >= plain.device:  # activations are a good part of it
        lighter = ", model.activation_checkpointing=true or a smaller batch_size"
    return f"{alone}: use more ranks (the state divides by their number){lighter}"


def memory_errors(cfg: TrainConfig, ranks_here: int, backend: str) -> list[str]:
    """A model whose training state cannot fit one rank's GPU (its total memory, read with
    nvidia-smi) or this node's host memory, under the config's `parallel` choice, with the
    choice that would fit. Sized on the meta device (no memory allocated); the rule is
    clorch.plan.memory's. A model of your own that cannot be built on the meta device is
    not checked; a rank then reports torch's own out-of-memory error. A `parallel.shard`
    naming a class the model does not have is an error here too (it names the classes it has);
    like the memory check, it runs before clorch's own launch, not in the ranks of torchrun or srun."""
    # lazy: keeps torch out of clorch-train's start
    import torch

    layout = cfg.parallel.layout(ranks_here * min_nodes(cfg.launcher.nnodes))
    sharded = layout.sharded
    try:
        sizes = model_sizes_of(cfg)  # on the host: a task may draw samples
        with torch.device("meta"):
            model = build_model_for(cfg, sizes)
    except Exception as exc:  # a user model that cannot be built on the meta device: not checked here
        reraise_interrupt(exc)
        return []
    gpu = _gpu_memory(cfg.launcher, ranks_here) if backend == "nccl" else None
    try:
        memory = config_memory(
            cfg,
            model,
            layout.shard_size,  # each rank holds 1/shard_size of its replica's state
            sharded=sharded,
            cpu_offload=sharded and cfg.parallel.cpu_offload,
            cpu_ranks=backend != "nccl",
        )
    except (ValueError, TypeError) as exc:
        if not sharded:
            raise
        # parallel.shard names a class the model does not have (the message names those it has)
        found = str(exc).removeprefix("shard_modules ")
        return [f"parallel.shard={cfg.parallel.shard} {found}; name some of them, or use parallel.shard=auto"]
    host = _available_memory()
    found = too_large(memory, ranks_here, gpu, host)
    if not found:
        return []
    offload = " parallel.cpu_offload=true" if memory.offloaded else ""
    return [
        f"model={cfg.model.name}: {memory.params:,} parameters need about {' and '.join(found)} under "
        f"parallel={cfg.parallel.name}{offload} ({_bytes_each(cfg, memory)}; {memory.describe()})"
        + _alternative(cfg, model, layout, memory.cpu_ranks, ranks_here, gpu, host)
    ]


def gpu_bytes_per_rank(cfg: TrainConfig, ranks_here: int = 1) -> int | None:
    """The GPU memory one rank of `cfg` needs by clorch.plan.memory's rule (CUDA's context included),
    with `ranks_here` ranks on the node; None where it is not estimated: a model of your own, whose
    activations clorch does not estimate, or one that cannot be built on the meta device."""
    # lazy: keeps torch out of clorch-train's start
    import torch

    layout = cfg.parallel.layout(ranks_here * min_nodes(cfg.launcher.nnodes))
    try:
        sizes = model_sizes_of(cfg)
        with torch.device("meta"):
            model = build_model_for(cfg, sizes)
        memory = config_memory(
            cfg,
            model,
            layout.shard_size,
            sharded=layout.sharded,
            cpu_offload=layout.sharded and cfg.parallel.cpu_offload,
            cpu_ranks=False,
        )
    except Exception as exc:  # not estimated; the trial itself reports what is wrong
        reraise_interrupt(exc)
        return None
    return memory.device if memory.activations else None


def _bytes_each(cfg: TrainConfig, memory: RankMemory) -> str:
    """What a parameter's bytes are made of, in words."""
    states = cfg.optim.states()
    base = bytes_per_parameter(cfg.optim.name, states=states, sharded=True)
    words = f"{base} bytes each: weights, gradients, optimizer state ({states} buffer(s))"
    extra = memory.bytes_per_param - base
    return words + (f", plus {extra} for autocast's and the buckets' low-precision copies" if extra else "")


def schedule_errors(cfg: TrainConfig, total: int) -> list[str]:
    schedule = cfg.schedule
    if schedule.decays and total <= schedule.warmup_steps:
        return [
            f"schedule.warmup_steps={schedule.warmup_steps} must be < the run's "
            f"{total} optimizer steps for schedule={schedule.name}: set schedule.warmup_steps below "
            f"{total} (e.g. schedule.warmup_steps={total // 10}), or run more steps (max_steps, epochs)"
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
