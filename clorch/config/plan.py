"""The front door: a composed config becomes one checked, machine-resolved launch plan.

Every way of starting a run comes through here once: `clorch-train` (its Hydra
job, and every combination of a sweep before the sweep starts), `clorch.run_local`,
and each rank of an outside launcher (torchrun, srun, submitit), which has no
launching process of its own to check for it. `plan_or_errors(cfg, run_dir)`
makes relative paths absolute against the directory the user ran from,
resolves interpolations (one that does not resolve is an error naming its
key), checks the config against the schemas (clorch.config.checks), and adds
the errors that need the machine (nccl without GPUs, devices that do not
exist), the data's sizes (a batch larger than a rank's shard, an eval split
smaller than the job, a model sequence shorter than the samples), the
filesystem (directories the run cannot write) and the checkpoint to resume
(another model, world size or batch size, clorch.config.resume): all of them
at once. The dataset sizes come from `clorch.data.tasks.split_size`, without
building the data.

The ranks receive the plan (`Plan.to_dict()` in their launch arguments, or a
plan file with its digest under `launcher=torchrun`) and do not check it again;
`for_world_size` adapts the step arithmetic when an elastic rendezvous formed
another world size than the plan's.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from omegaconf import DictConfig

from clorch.config.checks import ConfigError, checked_partial, complete, reused_dir_errors
from clorch.config.paths import with_absolute_paths
from clorch.config.schema import BACKENDS, GPTConfig, TrainConfig
from clorch._files import unwritable


@dataclass(frozen=True)
class Plan:
    """What the config became on this machine; the ranks run exactly this."""

    config: TrainConfig          # the checked config
    backend: str                 # "nccl" or "gloo"
    nproc_per_node: int          # ranks on this node
    devices: list[int] | None    # CUDA device indices, None for CPU ranks
    world_size: int              # ranks in the whole job
    device_type: str             # "cuda" or "cpu"
    train_size: int              # samples in the training split
    eval_size: int               # samples in the held-out split
    shard_size: int              # samples per rank per epoch
    steps_per_epoch: int         # optimizer steps per epoch
    total_steps: int             # optimizer steps in the run

    def describe(self) -> str:
        """One line for the user: where and how the job runs."""
        from clorch.precision import get_precision

        where = (f"{self.nproc_per_node} CUDA rank(s) on devices {self.devices} over {self.backend}"
                 if self.device_type == "cuda"
                 else f"{self.nproc_per_node} CPU rank(s) over {self.backend} (no CUDA GPU visible)")
        amp = get_precision(self.config.precision.name).describe(self.device_type)
        nodes = f" x {self.world_size // self.nproc_per_node} nodes" if self.world_size > self.nproc_per_node else ""
        return (f"clorch: running {where}{nodes}, {amp}; "
                f"{self.total_steps} steps of {self.steps_per_epoch} per epoch")

    def to_dict(self) -> dict[str, Any]:
        """Plain values (env.json, the ranks' arguments); `from_dict` reverses it."""
        out = asdict(self)
        out["config"] = self.config.to_dict()
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "Plan":
        """The plan `to_dict` wrote (trusted: it was checked when it was made)."""
        return cls(**{**values, "config": TrainConfig.from_dict(dict(values["config"]))})

    def digest(self) -> str:
        """sha256 of the plan's plain values: equal plans, equal digests."""
        return _digest(self.to_dict())


def _digest(values: Mapping[str, Any]) -> str:
    import hashlib
    import json

    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()


def write_plan(plan: Plan, path: Path) -> None:
    """Write the plan and its digest for ranks started by another process (torchrun's agent)."""
    import json

    from clorch._files import write_text_atomic

    write_text_atomic(path, json.dumps({"plan": plan.to_dict(), "sha256": plan.digest()}))


def read_plan(path: Path) -> Plan:
    """The plan `write_plan` wrote, unchecked but for its digest.

    Raises:
        ValueError: the file is not a plan, or was changed after it was written.
    """
    import json

    try:
        record = json.loads(Path(path).read_text())
        plan = Plan.from_dict(record["plan"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a launch plan clorch wrote ({exc})") from None
    if plan.digest() != record.get("sha256"):
        raise ValueError(f"{path}: the launch plan was changed after clorch checked it (its digest differs)")
    return plan


def _backend(cfg: Any) -> str | None:
    """The top-level backend, also when another top-level key has an error (so that an
    unusable backend is still reported beside it)."""
    backend = cfg.backend if complete(cfg, "top") else getattr(cfg, "raw", {}).get("backend")
    return backend if backend in BACKENDS else None


def _ranks(launcher: Any, backend: str, problems: list[str]) -> tuple[int, list[int] | None, str]:
    from clorch.launch.gpus import resolve_ranks

    nproc = None if launcher.nproc_per_node == "auto" else launcher.nproc_per_node
    devices = getattr(launcher, "devices", None)  # the torchrun launcher places ranks itself
    before = len(problems)
    count, cuda, name = resolve_ranks(nproc, devices, backend, os.environ, problems)
    for i in range(before, len(problems)):  # the launcher names its arguments bare, in Python
        text = problems[i].replace("devices=None", "launcher.devices=null")
        problems[i] = f"launcher.{text}" if text.startswith(("devices", "nproc")) \
            else f"backend={backend}: {text}"
    if cuda is None:
        return count, None, name or "gloo"
    return count, devices if devices is not None else list(range(len(cuda))), name or "nccl"


def min_nodes(nnodes: int | str) -> int:
    """The smallest node count of `launcher.nnodes` (N, or "MIN:MAX" for torchrun)."""
    try:
        return int(str(nnodes).split(":")[0])
    except ValueError:
        return 1  # reported by the config checks


def data_kwargs(cfg: TrainConfig) -> dict[str, Any]:
    """The data section's keys other than `name`: the task builder's keyword arguments."""
    return {k: v for k, v in asdict(cfg.data).items() if k != "name"}


def _drop_last(cfg: Any) -> bool | None:
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
    shard = size // world if _drop_last(cfg) else math.ceil(size / world)
    steps_per_epoch = max(1, math.ceil(shard / (cfg.batch_size * cfg.accumulation)))
    return shard, steps_per_epoch, cfg.max_steps or cfg.epochs * steps_per_epoch


def _data_errors(cfg: TrainConfig, train: int, held_out: int, world: int) -> list[str]:
    errors = []
    shard = plan_steps(cfg, train, world)[0]
    if cfg.batch_size > shard:
        errors.append(f"batch_size={cfg.batch_size} is larger than a rank's shard: "
                      f"{train} training samples over {world} ranks give {shard} per rank "
                      f"(use batch_size <= {shard}, more data, or fewer ranks)")
    if held_out < world:
        errors.append(f"data={cfg.data.name}: the eval split has {held_out} sample(s), fewer than "
                      f"the job's {world} ranks (every rank evaluates at least one): raise "
                      f"data.sample_count or data.eval_fraction, or use fewer ranks")
    return errors


def _model_errors(cfg: TrainConfig) -> list[str]:
    """A GPT sized smaller than the data's samples or vocabulary."""
    from clorch.data.tasks import model_sizes

    if not isinstance(cfg.model, GPTConfig):
        return []
    needed = model_sizes(cfg.data.name, **data_kwargs(cfg))
    errors = []
    for key in ("seq_len", "vocab_size"):
        value = getattr(cfg.model, key)
        if value is not None and key in needed and value < needed[key]:
            errors.append(f"model.{key}={value} is smaller than data={cfg.data.name}'s "
                          f"{needed[key]}: use model.{key} >= {needed[key]}, or null (the data's)")
    return errors


RANKS_PER_CPU = 4  # more CPU ranks than this per core is a typo, not a plan
# Bytes a parameter costs during training: fp32 weight, gradient, two AdamW moments.
TRAINING_BYTES_PER_PARAMETER = 16


def _rank_count_errors(nproc: int, backend: str) -> list[str]:
    """CPU ranks far beyond this machine's cores (GPU ranks are checked against the GPUs)."""
    cores = os.cpu_count() or 1
    if backend == "gloo" and nproc > RANKS_PER_CPU * cores:
        return [f"launcher.nproc_per_node={nproc} is far more ranks than this machine's {cores} CPU "
                f"core(s) can run (at most {RANKS_PER_CPU * cores}, {RANKS_PER_CPU} per core)"]
    return []


def _node_errors(launcher: Any) -> list[str]:
    """The local launcher's node layout, checked as `launch()` will check it (names prefixed)."""
    if launcher.name != "local":
        return []
    from clorch.launch.config import check_nodes

    problems: list[str] = []
    check_nodes({"nnodes": launcher.nnodes, "node_rank": launcher.node_rank,
                 "master_addr": launcher.master_addr, "master_port": launcher.master_port}, problems)
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


def _memory_errors(cfg: TrainConfig, ranks_here: int, backend: str) -> list[str]:
    """A model whose training state cannot fit: the CPU ranks' copies in this machine's memory.
    Sized on the meta device (no memory allocated). GPU memory is not checked here: asking
    for it would start CUDA in the launching process; a rank reports CUDA's own out-of-memory."""
    import torch

    from clorch.engine.components import build_model_for

    if backend == "nccl":
        return []
    try:
        with torch.device("meta"):
            params = sum(p.numel() for p in build_model_for(cfg).parameters())
    except Exception:  # a user model that cannot be built on the meta device: not checked here
        return []
    need, have = params * TRAINING_BYTES_PER_PARAMETER * ranks_here, _available_memory()
    if have is None or need <= have:
        return []
    return [f"model={cfg.model.name}: {params:,} parameters need about {need / 2**30:.1f} GiB to train "
            f"({TRAINING_BYTES_PER_PARAMETER} bytes each: weights, gradients, optimizer state, per rank), "
            f"more than the memory available for {ranks_here} rank(s) ({have / 2**30:.1f} GiB)"]


def _schedule_errors(cfg: TrainConfig, total: int) -> list[str]:
    schedule = cfg.schedule
    if schedule.name == "cosine" and total <= schedule.warmup_steps:
        return [f"schedule.warmup_steps={schedule.warmup_steps} must be < the run's "
                f"{total} optimizer steps for schedule=cosine"]
    return []


def _path_errors(cfg: TrainConfig, run_dir: Path | None) -> list[str]:
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


def _external_ranks(cfg: Any, external: Any, problems: list[str]) -> tuple[int, list[int] | None, str]:
    """Ranks as the external launcher placed them: this node's count, this rank's device."""
    from clorch.distributed.groups import resolve_backend

    try:
        backend = resolve_backend(cfg.backend)
    except ValueError as exc:
        problems.append(f"backend={cfg.backend}: {exc}")
        backend = "gloo"
    devices = [external.env.local_rank] if backend == "nccl" else None
    return external.env.local_world_size, devices, backend


def _build(cfg: Any, run_dir: Path | None, problems: list[str], external: Any = None) -> Plan | None:
    """The plan, adding every error found to `problems`.

    `cfg` may be a `Partial` (some sections have errors): each check runs when the
    sections it reads are valid, so that every error is reported in one go.
    """
    from clorch.data.tasks import split_size
    from clorch.config.resume import resume_errors

    world = sizes = None
    if external is not None and complete(cfg, "top"):
        nproc, devices, backend = _external_ranks(cfg, external, problems)
        world = external.env.world_size
    elif complete(cfg, "launcher") and _backend(cfg) is not None:
        nproc, devices, backend = _ranks(cfg.launcher, _backend(cfg), problems)
        world = nproc * min_nodes(cfg.launcher.nnodes)
        problems += _rank_count_errors(nproc, backend) + _node_errors(cfg.launcher)
    if complete(cfg, "top", "data"):
        try:
            kwargs = data_kwargs(cfg)
            sizes = (split_size(cfg.data.name, "train", cfg.seed, **kwargs),
                     split_size(cfg.data.name, "eval", cfg.seed, **kwargs))
            if complete(cfg, "model"):
                problems += _model_errors(cfg)
                if world is not None and not problems and external is None:
                    # (not for another launcher's ranks: free memory differs from rank to rank,
                    # and a check that stops some ranks only leaves the others waiting)
                    problems += _memory_errors(cfg, nproc, backend)
        except (ValueError, TypeError, OSError) as exc:  # the task rejects its arguments
            message = f"data={cfg.data.name}: {exc}".replace("text.path", "data.path")
            if not any(p.startswith("data.path") for p in problems) or "data.path" not in message:
                problems.append(message)  # (a missing data.path is reported once, by the checks)
    if complete(cfg, "checkpoint"):
        problems += _path_errors(cfg, run_dir)
    if world is None or sizes is None or _drop_last(cfg) is None:
        return None
    problems += _data_errors(cfg, *sizes, world)
    shard, per_epoch, total = plan_steps(cfg, sizes[0], world)
    if complete(cfg, "schedule"):
        problems += _schedule_errors(cfg, total)
    if complete(cfg, "checkpoint", "model", "data", "optim"):
        problems += resume_errors(cfg, world, run_dir)
    if problems:
        return None
    return Plan(config=cfg, backend=backend, nproc_per_node=nproc, devices=devices,
                world_size=world, device_type="cuda" if backend == "nccl" else "cpu",
                train_size=sizes[0], eval_size=sizes[1], shard_size=shard,
                steps_per_epoch=per_epoch, total_steps=total)


def plan_or_errors(cfg: DictConfig | Mapping[str, Any] | TrainConfig,
                   run_dir: str | os.PathLike | None = None,
                   external: Any = None, base: str | os.PathLike | None = None) -> tuple[Plan | None, list[str]]:
    """(the plan, or None, and every error: the config's, the machine's, the data's, the paths').

    Args:
        cfg: a composed config (Hydra's, or clorch.config.composer's), or a TrainConfig.
        run_dir: the run directory, checked for being writable (None: not checked).
        external: a clorch.launch.external.ExternalRank: place the ranks as another launcher
            (torchrun, srun) did, instead of the launcher config and this machine.
        base: make relative paths absolute against this directory first (a Hydra job passes
            the one the user ran clorch-train from); None checks them as written, relative to
            the current directory (`absolute` makes the plan's paths absolute afterwards).
    """
    if isinstance(cfg, TrainConfig):
        typed, problems = cfg, []
    else:
        try:
            values = cfg if base is None else with_absolute_paths(cfg, base)
        except ConfigError as exc:  # an interpolation that does not resolve
            return None, exc.errors
        typed, problems = checked_partial(values)
    if typed is None:
        return None, problems
    plan = _build(typed, None if run_dir is None else Path(run_dir), problems, external)
    return (None, problems) if problems else (plan, [])


def absolute(plan: Plan, base: str | os.PathLike) -> Plan:
    """The plan with its config's relative paths made absolute against `base` (no new checks:
    a path names the same file either way from `base`)."""
    from dataclasses import replace

    return replace(plan, config=TrainConfig.from_dict(with_absolute_paths(plan.config.to_dict(), base)))


def config_key(cfg: DictConfig | Mapping[str, Any], base: str | os.PathLike | None = None) -> str | None:
    """A digest of the composed config as the door reads it (None: it does not resolve).

    Equal for the same composed config wherever it was composed, so that a sweep's jobs
    find the plans checked for them before the sweep started.
    """
    try:
        return _digest(with_absolute_paths(cfg, os.getcwd() if base is None else base))
    except ConfigError:
        return None


def run_dir_errors(plan: Plan, run_dir: str | os.PathLike) -> list[str]:
    """The checks of a plan made without a run directory that need one: the directory is
    writable, a reused one holds no other run's step checkpoints, and the checkpoint a
    resume would take from it fits."""
    from clorch.config.resume import resume_errors

    run_dir = Path(run_dir)
    return _path_errors(plan.config, run_dir) + resume_errors(plan.config, plan.world_size, run_dir)


def for_world_size(plan: Plan, world_size: int, run_dir: Path | None = None) -> tuple[Plan, list[str]]:
    """The plan as ranks that an elastic rendezvous gathered `world_size` strong run it.

    The config was checked when the plan was made; only what depends on the world
    size is computed (and checked: the shard against the batch, the eval split against
    the ranks, the checkpoint to resume) again. The same plan when the size is the plan's.
    """
    from dataclasses import replace

    from clorch.config.resume import resume_errors

    if world_size == plan.world_size:
        return plan, []
    cfg = plan.config
    errors = _data_errors(cfg, plan.train_size, plan.eval_size, world_size)
    errors += resume_errors(cfg, world_size, run_dir)
    shard, per_epoch, total = plan_steps(cfg, plan.train_size, world_size)
    return replace(plan, world_size=world_size, shard_size=shard, steps_per_epoch=per_epoch,
                   total_steps=total), errors


@contextlib.contextmanager
def run_errors_as_config_errors() -> Iterator[None]:
    """Report, as config errors naming their key, what stops a run at its start that a
    setting explains: another live job holding the checkpoint directory (checkpoint.dir).

    Raises:
        ConfigError: in place of clorch.checkpoint.locks.DirectoryInUse.
    """
    from clorch.checkpoint.locks import DirectoryInUse

    try:
        yield
    except DirectoryInUse as exc:
        raise ConfigError([f"checkpoint.dir: {exc}"]) from None


def plan_overrides(overrides: list[str], run_dir: str | os.PathLike | None = None) -> Plan:
    """Compose `overrides` as clorch-train would (Hydra keys aside) and resolve the plan.

    Raises:
        ConfigError: every composition and config error, together.
    """
    from clorch.config.preflight import compose_once

    cfg, errors = compose_once([o for o in overrides if not o.partition("=")[0].lstrip("+~").startswith("hydra")])
    if cfg is not None:
        plan, found = plan_or_errors(cfg, run_dir)
        errors += [e for e in found if e not in errors]
    if errors:
        raise ConfigError(errors)
    return plan


def resolve_errors(cfg: DictConfig | Mapping[str, Any]) -> list[str]:
    """Every error `resolve` would raise (empty when the config runs here)."""
    return plan_or_errors(cfg)[1]


def resolve(cfg: DictConfig | Mapping[str, Any] | TrainConfig,
            run_dir: str | os.PathLike | None = None, base: str | os.PathLike | None = None) -> Plan:
    """Check `cfg` and resolve it on this machine into the launch plan.

    Args:
        cfg: a composed config, or an already checked TrainConfig.
        run_dir: the run directory, checked for being writable (None: not checked).
        base: the directory relative paths are relative to (default: the current one).

    Raises:
        ConfigError: every config, machine, data, path and resume error found, together.
    """
    plan, problems = plan_or_errors(cfg, run_dir, base=base)
    if problems:
        raise ConfigError(problems)
    return plan
