"""Checkpoint policy for the worker: where checkpoints go, when, and what to resume.

The checkpoint holds model, optimizer, sampler and scaler (clorch.checkpoint)
plus the loop state: step, epoch and the schedule's state, so a resumed run
continues exactly where the checkpoint was taken.

The `parallel` mode's strategy (clorch.strategies) owns the format: a file archive
under `parallel=ddp` (`step_00000100.ckpt`, `final.ckpt`), a sharded directory
under `parallel=fsdp` (`step_00000100.dcp`, `final.dcp`) to which every rank writes
its own shards; the same policies (final, periodic, keep_last, resume=latest) apply.

Either kind resumes on another world size: the model and optimizer load whole
(a checkpoint file) or resharded (DCP); the sampler continues the job's global
position (`DistributedSampler.global_state_dict`, in every checkpoint), so the
rest of the epoch comes in the uninterrupted run's order, provided the run keeps
the checkpoint's global batch (clorch-train's plan sets `accumulation` so, see
clorch.plan.resume; `restore` refuses a run that does not). Random streams cannot be re-split over
another number of ranks: each rank then seeds torch's generators afresh from the
run's seed, its rank and the step (`reseed_for`), deterministically.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from clorch.checkpoint import CheckpointError
from clorch.checkpoint.policy import Latest
from clorch.checkpoint.sharded import WorldSizeChangedWarning
from clorch.config.layout import ParallelLayout
from clorch.plan.resume import RECORD_KEY, batch_counts, run_record
from clorch.config.schema import TrainConfig
from clorch.data.base import derive_seed
from clorch.distributed import all_gather_into, is_initialized, rank, world_size
from clorch.train.batch_statistics import world_size_warning
from clorch.train.components import TRAINING_STREAM, Components
from clorch.train.loop import LoopState
from clorch.train.metrics import announce
from clorch.env import restart_count as env_restart_count
from clorch.strategies import Strategy, strategy_class
from clorch.strategies.ddp import SAMPLER_KEY  # noqa: F401  (a checkpoint file's sampler position, read here before)


def checkpoint_dir(cfg: TrainConfig, run_dir: Path) -> Path:
    """`checkpoint.dir`, or <run dir>/checkpoints."""
    configured = cfg.checkpoint.dir
    return Path(configured).expanduser() if configured else run_dir / "checkpoints"


def _format(cfg: TrainConfig) -> type[Strategy]:
    """The strategy class of the run's `parallel` mode: its checkpoints' format."""
    return strategy_class(cfg.parallel)


def final_path(cfg: TrainConfig, run_dir: Path) -> Path:
    """`checkpoint.path`, or <checkpoint dir>/ the strategy's final name (final.ckpt; final.dcp,
    a directory, when sharded)."""
    configured = cfg.checkpoint.path
    name = _format(cfg).final_name
    return Path(configured).expanduser() if configured else checkpoint_dir(cfg, run_dir) / name


def step_path(cfg: TrainConfig, directory: Path, step: int) -> Path:
    """The step checkpoint's path: step_00000100.ckpt, or step_00000100.dcp when sharded."""
    return _format(cfg).step_path(directory, step)


def restart_count() -> int:
    """How many times a launcher (clorch's or torchrun's) restarted this job (0 on the first start)."""
    return env_restart_count()


def resume_path(cfg: TrainConfig, run_dir: Path) -> Path | None:
    """The checkpoint to start from, or None for a fresh start.

    `checkpoint.resume`: none, latest (the newest step checkpoint in the
    checkpoint directory that verifies completely; none yet means a fresh start), or
    a path. After a restart by the launcher the newest step checkpoint this job wrote
    wins; before the first one exists the restart starts as configured (from the
    resume path, or fresh). Newer step checkpoints that fail verification (damaged,
    incomplete, unsafe) are skipped: each is named, with why, on the console and in
    the run's events.jsonl (`report_skipped`). Rank 0 only: it hashes every file of
    the checkpoints it looks at.
    """
    resume = cfg.checkpoint.resume
    if restart_count() > 0 or resume == "latest":
        directory = checkpoint_dir(cfg, run_dir)
        latest = _format(cfg).find_latest(directory) if directory.is_dir() else Latest(None, [])
        report_skipped(run_dir, latest)
        if latest.path is not None or resume in ("latest", "none"):
            return latest.path
    if resume == "none":
        return None
    return Path(resume).expanduser()


def report_skipped(run_dir: Path, latest: Latest) -> None:
    """Say which newer checkpoints a resume skipped and why: one console line and one
    events.jsonl event (`skipped_checkpoint`, `reason`) each. Rank 0 only."""
    for path, reason in latest.skipped:
        fallback = f"resuming from {latest.path}" if latest.path is not None else "no older checkpoint verifies"
        message = f"checkpoint.resume: skipped {path}, which does not verify ({reason}); {fallback}"
        print(f"clorch: {message}", flush=True)
        announce(run_dir, message, skipped_checkpoint=str(path), reason=reason)


def agreed_resume_path(cfg: TrainConfig, run_dir: Path) -> Path | None:
    """`resume_path` as rank 0 sees it, the same on every rank.

    Every rank must call it: with a group of more than one rank it is one
    broadcast from rank 0, which blocks until rank 0 has chosen. Without it,
    ranks that see different files (a node without the shared checkpoint
    directory, a checkpoint committed in between) could disagree on whether
    to resume, and the ones that load would wait forever on the others.
    Only rank 0 verifies the candidates (hashing each archive).
    """
    path = resume_path(cfg, run_dir) if rank() == 0 else None
    if is_initialized() and world_size() > 1:
        box = [None if path is None else str(path)]
        dist.broadcast_object_list(box, src=0)
        path = None if box[0] is None else Path(box[0])
    return path


def save(cfg: TrainConfig, parts: Components, path: Path, state: LoopState, run_dir: Path | None = None) -> None:
    """Write a checkpoint of everything needed to continue.

    Every rank must call it (it is collective: the strategy's `save`, clorch.checkpoint's
    save_checkpoint or save_sharded); it blocks until rank 0 has committed the checkpoint.

    Args:
        run_dir: the run directory writing it: a run resumed from the checkpoint
            starts its metrics.jsonl with that directory's records up to the step.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    # The open logging window travels too, so the first metrics line after a
    # resume averages the same steps as an uninterrupted run's (one host read).
    window = _gather_window(parts, state)
    training = {
        RECORD_KEY: run_record(cfg, parts.world_size),
        "step": state.step,
        "epoch": state.epoch,
        "scheduler": _scheduler_state(parts.scheduler),
        "window_loss": window,
        "window_steps": state.window_steps,
        "window_samples": state.window_samples,
        "window_norm": _window_norm(state),
        "run_dir": None if run_dir is None else str(run_dir),
    }
    parts.strategy.save(path, parts.sampler, training)


def restore(parts: Components, path: Path, seed: int, layout: ParallelLayout) -> LoopState:
    """Load a checkpoint into the components and return the loop state to continue from.

    Every rank must call it (collective: the strategy's `load`, clorch.checkpoint's load_checkpoint
    or load_sharded).
    A checkpoint of another world size loads too (module docstring) when this run keeps
    its global batch (over the `layout`'s data-parallel ranks, the plan's); each rank's
    generators are then seeded by `reseed_for(seed, ...)`.

    Raises:
        ValueError: the checkpoint does not match the model or is not a clorch checkpoint.
        CheckpointError: this run does not keep the checkpoint's batch_size and global batch.
    """
    with warnings.catch_warnings():
        # another world size: the RNG states are not restored (reseeded below, `reseed_for`)
        warnings.simplefilter("ignore", WorldSizeChangedWarning)
        saved = _load(parts, path)
    record = saved.get(RECORD_KEY) if isinstance(saved, dict) else None
    saved_world = record.get("world_size") if isinstance(record, dict) else None
    saved_world = saved_world if type(saved_world) is int and saved_world >= 1 else parts.world_size
    _check_training_state(path, saved, saved_world)
    note = _check_global_batch(path, record, parts, layout)
    warning = None
    if saved_world != parts.world_size:
        reseed_for(seed, parts.rank, saved["step"])
        warning = world_size_warning(parts.raw_model, saved_world, parts.world_size, parts.accumulation)
    scheduler_state = saved.get("scheduler")
    if scheduler_state:
        parts.scheduler.load_state_dict(scheduler_state)
    window = saved.get("window_loss")
    if window is not None:
        # Each rank continues its own window; on another world size each carries the saved
        # ranks' mean, so the first metrics line still averages the job's losses.
        mine = window[parts.rank] if saved_world == parts.world_size else sum(window) / len(window)
        window = torch.tensor(mine, dtype=torch.float32, device=parts.device)
    norm = saved.get("window_norm")  # the same on every rank (the gradients are all-reduced)
    norms = None if norm is None else [torch.tensor(float(x), dtype=torch.float32, device=parts.device) for x in norm]
    return LoopState(
        step=int(saved["step"]),
        epoch=int(saved["epoch"]),
        resumed=True,
        window_loss=window,
        window_norm=None if norms is None else norms[0],
        window_norms=None if norms is None else norms[1],
        window_steps=int(saved.get("window_steps", 0)),
        # per rank: the job's samples shared by this run's data-parallel ranks (only throughput
        # reads it); the saved run's every rank read data
        window_samples=int(saved.get("window_samples", 0)) * saved_world // layout.dp_size,
        resumed_run_dir=saved.get("run_dir") or _run_dir_of(path),
        resume_note=note,
        resume_warning=warning,
    )


def reseed_for(seed: int, rank: int, step: int) -> None:
    """Seed torch's generators (CPU and every CUDA device) for a resume onto another world size.

    The saved ranks' random streams (dropout's) cannot be split over another number of
    ranks. Each rank draws from a stream of its own instead, derived from the run's seed,
    its rank and the step resumed at: ranks draw differently, none repeats a fresh start's
    stream (`clorch.train.components.training_seed`), and resuming the same checkpoint on
    the same world size draws the same numbers again. Python's and numpy's generators are
    left as a fresh start leaves them. Local.
    """
    torch.manual_seed(derive_seed(seed, TRAINING_STREAM, rank + 1, step + 1))


def _load(parts: Components, path: Path) -> Any:
    """Load model, optimizer, sampler (and scaler) on every rank through the strategy, in its
    format; return the checkpoint's state."""
    return parts.strategy.load(path, parts.sampler)


def _check_global_batch(path: Path, record: Any, parts: Components, layout: ParallelLayout) -> str | None:
    """Refuse a run that does not keep the checkpoint's batch_size and global batch (the same
    on every rank); return the line saying what a resume onto another world size kept, or None.

    clorch-train's plan sets `accumulation` to keep it (clorch.plan.resume); this catches a run
    started otherwise. A checkpoint that does not record its batch is not checked.

    Raises:
        CheckpointError: another batch_size, or another global batch.
    """
    counts = batch_counts(record)
    if counts is None:
        return None
    # the saved run's data-parallel size is its world size (each rank of ddp, fsdp, hsdp reads data)
    batch, ranks, accumulation = counts["batch_size"], counts["world_size"], counts["accumulation"]
    readers = layout.dp_size
    global_batch = batch * ranks * accumulation
    ours = parts.batch_size * readers * parts.accumulation
    if parts.batch_size == batch and ours == global_batch:
        if ranks == readers:
            return None
        return (
            f"world size {ranks} -> {readers}, accumulation {accumulation} -> "
            f"{parts.accumulation} keeps the global batch of {global_batch}"
        )
    per_step = batch * readers
    hint = (
        f"use batch_size={batch} and accumulation={global_batch // per_step}"
        if global_batch % per_step == 0
        else f"{readers} ranks cannot keep it with batch_size={batch}"
    )
    raise CheckpointError(
        f"checkpoint {path} was trained with a global batch of {global_batch} (batch_size {batch} x "
        f"{ranks} ranks x accumulation {accumulation}), this run has {ours} (batch_size "
        f"{parts.batch_size} x {readers} ranks x accumulation {parts.accumulation}): a resume "
        f"keeps batch_size and the global batch, so that each optimizer step averages the samples "
        f"the uninterrupted run's would (clorch-train sets accumulation so); {hint}"
    )


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _numbers(value: Any, length: int) -> bool:
    """Whether `value` is a list of `length` plain numbers (no bools)."""
    return (
        isinstance(value, list)
        and len(value) == length
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)
    )


def _state_rules(world_size: int) -> dict[str, tuple[Any, str]]:
    """Each field `save` writes: (whether a value fits, what is allowed)."""
    return {
        "step": (_count, "an int >= 0"),
        "epoch": (_count, "an int >= 0"),
        "window_steps": (lambda v: v is None or _count(v), "an int >= 0"),
        "window_samples": (lambda v: v is None or _count(v), "an int >= 0"),
        "scheduler": (lambda v: v is None or isinstance(v, dict), "a dict (the schedule's state)"),
        "run_dir": (lambda v: v is None or isinstance(v, str), "a path"),
        "window_norm": (
            lambda v: v is None or _numbers(v, 2),
            "null or [sum, count] of the window's gradient norms",
        ),
        "window_loss": (
            lambda v: v is None or _numbers(v, world_size),
            f"null or a list of {world_size} numbers (one per rank)",
        ),
    }


def _check_training_state(path: Path, saved: Any, world_size: int) -> None:
    """The engine's own fields of a checkpoint's state, as `save` writes them.

    The metadata's checksum proves only that the file is as written; a crafted or foreign
    state with odd types is refused here, naming the field, rather than failing mid-resume.

    Raises:
        CheckpointError: the first field that is not what `save` writes.
    """
    if not isinstance(saved, dict):
        raise CheckpointError(f"checkpoint {path}: its state is {type(saved).__name__}, not a dict")
    for key, (fits, allowed) in _state_rules(world_size).items():
        value = saved.get(key) if key not in ("step", "epoch") else saved.get(key, "missing")
        if not fits(value):
            raise CheckpointError(
                f"checkpoint {path} is not one clorch's engine wrote: state field "
                f"{key!r} is {value!r:.80}, expected {allowed}"
            )


def _run_dir_of(path: Path) -> str | None:
    """The run directory of a checkpoint that does not name it (written before clorch recorded
    it): `<run dir>/checkpoints/`'s parent, when that holds a run's metrics.jsonl."""
    parent = Path(path).parent
    if parent.name == "checkpoints" and (parent.parent / "metrics.jsonl").is_file():
        return str(parent.parent)
    return None


def _gather_window(parts: Components, state: LoopState) -> list[float] | None:
    """Every rank's open window loss (checkpoints keep rank 0's state only).

    Collective when a window is open: every rank calls it from `save`.
    """
    if state.window_loss is None:
        return None

    mine = state.window_loss.detach().float().reshape(1)
    if not is_initialized() or parts.world_size == 1:
        return mine.tolist()
    out = torch.empty(parts.world_size, dtype=torch.float32, device=mine.device)
    all_gather_into(out, mine)
    return out.tolist()


def _window_norm(state: LoopState) -> list[float] | None:
    """The open window's gradient-norm sum and count (one host read; local)."""
    if state.window_norm is None:
        return None
    return [float(state.window_norm.item()), float(state.window_norms.item())]


def _scheduler_state(scheduler: Any) -> dict[str, Any]:
    """The schedule's state as plain values (lr lambdas are objects with plain attributes)."""
    state = scheduler.state_dict()
    return {k: v for k, v in state.items() if not callable(v)}


def prune(cfg: TrainConfig, run_dir: Path) -> None:
    """Keep the newest `checkpoint.keep_last` step checkpoints. Rank 0 only."""
    _format(cfg).prune(checkpoint_dir(cfg, run_dir), cfg.checkpoint.keep_last)
