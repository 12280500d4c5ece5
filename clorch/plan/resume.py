"""Before launch: does the checkpoint to resume fit this run, and with which accumulation?

Each checkpoint the engine writes records the run that wrote it (`run_record`)
in its state: model, data, batch_size, accumulation and world size. A resume
with another model or data would fail inside the ranks (a shape mismatch) or
silently train on something else; these are reported with the other config
errors instead.

A resume onto another world size keeps the checkpoint's global batch
(batch_size x world size x accumulation), so that every optimizer step averages
the samples the uninterrupted run's would have: batch_size (what each forward
sees) stays, and `accumulation` is set to what keeps the global batch
(`resume_fit`; the plan replaces the configured value and says so in one line).
A world size that cannot keep it (the global batch is not a multiple of
batch_size x world size), or another batch_size, is refused before launch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from clorch._checkpoint_names import SHARDED_MARKER, SHARDED_STEP_NAME, step_checkpoints
from clorch.config.layout import ParallelLayout
from clorch.config.schema import CUDA_GRAPH_MODES, TargetModelConfig, TrainConfig
from clorch.env import restart_count
from clorch.plan.interrupted import reraise_interrupt

RECORD_KEY = "run"


def run_record(cfg: Any, world_size: int) -> dict[str, Any]:
    """What a resumed run must keep: the model, the data, the batch and the world size."""
    model = cfg.model
    model_values = {"_target_": model.target, **model.kwargs} if isinstance(model, TargetModelConfig) else asdict(model)
    return {
        "world_size": world_size,
        "batch_size": cfg.batch_size,
        "accumulation": cfg.accumulation,
        "model": model_values,
        "data": asdict(cfg.data),
    }


@dataclass(frozen=True)
class ResumeFit:
    """What the checkpoint to resume asks of this run.

    `accumulation` keeps the checkpoint's global batch on this world size (None: no
    checkpoint to resume, or one that does not record its batch); `note` is the one line
    that says what a resume onto another world size (or a configured accumulation) changed,
    or that `checkpoint.resume=latest` found nothing to resume.
    """

    errors: list[str] = field(default_factory=list)
    accumulation: int | None = None
    note: str | None = None

    def applied(self, cfg: Any) -> Any:
        """`cfg` with the accumulation that keeps the global batch (a config with errors as it is)."""
        if self.accumulation is None or self.accumulation == cfg.accumulation or not isinstance(cfg, TrainConfig):
            return cfg
        return replace(cfg, accumulation=self.accumulation)


_KINDS = {True: "sharded checkpoint (.dcp)", False: "step checkpoint"}


def _step_checkpoints(directory: Path | None, sharded: bool) -> list[Path]:
    """The step checkpoints of the kind this run writes, newest first, by name (their metadata is
    all this check reads; the ranks verify each and fall back to an older one when it is damaged)."""
    if directory is None or not directory.is_dir():
        return []
    if not sharded:
        return [path for _, path in step_checkpoints(directory)]
    named = [(int(m.group(1)), p) for p in directory.iterdir() if (m := SHARDED_STEP_NAME.fullmatch(p.name))]
    return [p for _, p in sorted(named, reverse=True) if (p / SHARDED_MARKER).is_file()]


def _newest(directory: Path | None, sharded: bool) -> Path | None:
    """The newest of `_step_checkpoints`, or None."""
    found = _step_checkpoints(directory, sharded)
    return found[0] if found else None


def _resume_dir(cfg: Any, run_dir: Path | None) -> Path | None:
    """Where `latest` (and a restart) looks: checkpoint.dir, else <run dir>/checkpoints."""
    ckpt = cfg.checkpoint
    return Path(ckpt.dir).expanduser() if ckpt.dir else (run_dir / "checkpoints" if run_dir else None)


def nothing_to_resume(cfg: Any, run_dir: Path | None, layout: ParallelLayout | None = None) -> str | None:
    """The line that says `checkpoint.resume=latest` found no checkpoint (the run starts from
    step 0, as the first run of a `latest` command line does), or None.

    `layout` (the plan's) says which kind of checkpoint the run resumes (sharded or files);
    None counts either kind.

    A directory that does not exist is not refused (the first run of the command that
    resumes itself has none yet: it is created for the run's checkpoints), but it is
    named, so that a misspelt checkpoint.dir shows before training starts.
    """
    if cfg.checkpoint.resume != "latest" or restart_count() > 0:
        return None
    directory = _resume_dir(cfg, run_dir)
    kinds = (True, False) if layout is None else (layout.sharded,)
    if directory is None or any(_newest(directory, sharded) is not None for sharded in kinds):
        return None
    kind = "step checkpoint" if layout is None else _KINDS[layout.sharded]
    where = (
        f"{directory.absolute()} does not exist (it is created for this run's checkpoints)"
        if not directory.exists()
        else f"no {kind} in {directory.absolute()}"
    )
    return f"checkpoint.resume=latest: nothing to resume: {where}; training starts from step 0"


def unmarked_errors(cfg: Any, run_dir: Path | None, layout: ParallelLayout) -> list[str]:
    """Directories named as sharded step checkpoints (step_N.dcp) without clorch.json, in the
    directory a parallel=fsdp run resumes `latest` from or writes its step checkpoints to.

    clorch commits a sharded checkpoint by writing clorch.json last, so such a directory is an
    incomplete copy or not clorch's: `latest` would skip it, and the run's own save of that
    step would refuse to replace it mid-run (clorch.checkpoint.sharded).
    """
    ckpt = cfg.checkpoint
    if not layout.sharded or (ckpt.resume != "latest" and ckpt.policy != "periodic") or restart_count() > 0:
        return []
    directory = _resume_dir(cfg, run_dir)
    if directory is None or not directory.is_dir():
        return []
    named = sorted(p for p in directory.iterdir() if SHARDED_STEP_NAME.fullmatch(p.name))
    unmarked = [p for p in named if not (p / SHARDED_MARKER).is_file()]
    key = f"checkpoint.dir={ckpt.dir}" if ckpt.dir else f"checkpoint.dir (null: {directory})"
    effect = "this run's save of that step would refuse to replace it"
    if ckpt.resume == "latest":
        effect = f"checkpoint.resume=latest would skip it, and {effect}"
    return [
        f"{key}: {path.absolute()} is named as a sharded step checkpoint but holds no {SHARDED_MARKER} "
        f"(an incomplete copy, or not written by clorch): {effect}; move it out of "
        f"{directory.absolute()} (or delete it), or copy the whole checkpoint in"
        for path in unmarked
    ]


def _candidates(cfg: Any, run_dir: Path | None, layout: ParallelLayout) -> list[Path]:
    """The checkpoints the ranks may start from, in the order they try them, as the launching
    process sees them now.

    The rule of `clorch.train.checkpoints.resume_path`: after a restart by a launcher the job's
    step checkpoints, newest first (the ranks skip a damaged one for the one before it); else
    checkpoint.resume: `latest` the same way, a path alone.
    """
    ckpt = cfg.checkpoint
    if ckpt.resume == "none" and restart_count() == 0:
        return []
    if restart_count() > 0 or ckpt.resume == "latest":
        found = _step_checkpoints(_resume_dir(cfg, run_dir), layout.sharded)
        if found or ckpt.resume in ("latest", "none"):
            return found
    return [Path(ckpt.resume).expanduser()]


def _read_sharded(path: Path) -> dict[str, Any]:
    """clorch.json of a sharded checkpoint (JSON: no torch needed to read it).

    Raises:
        OSError / ValueError: it is missing or not JSON; ValueError: not clorch's.
    """
    body = json.loads((path / SHARDED_MARKER).read_text())
    if not isinstance(body, dict) or not isinstance(body.get("world_size"), int):
        raise ValueError(f"{SHARDED_MARKER} is not a clorch sharded checkpoint's")
    return body


def _read(path: Path) -> dict[str, Any]:
    """The checkpoint's metadata: its world size and state.

    Raises:
        CheckpointError / OSError / ValueError: it cannot be read.
    """
    if path.is_dir():
        return _read_sharded(path)
    # lazy: clorch.checkpoint.metadata imports torch, kept out of clorch-train's start
    from clorch.checkpoint.metadata import read

    return read(path)


def _kind_error(cfg: Any, path: Path, key: str, layout: ParallelLayout) -> str | None:
    """A checkpoint of the other format: a sharded one (parallel=fsdp, hsdp) under a mode that
    resumes files (parallel=ddp), or the other way round."""
    if path.is_dir() and not layout.sharded:
        return (
            f"{key}: a sharded checkpoint (a directory parallel=fsdp or hsdp writes), and "
            f"parallel={cfg.parallel.name} resumes checkpoint files: resume it with parallel=fsdp"
        )
    if path.is_file() and layout.sharded:
        return (
            f"{key}: a checkpoint file (parallel=ddp writes them), and parallel={cfg.parallel.name} resumes "
            "sharded checkpoints (.dcp directories): resume it with parallel=ddp"
        )
    return None


def _ranks(world_size: int) -> str:
    return f"{world_size} rank{'s' if world_size != 1 else ''}"


def _world_key(cfg: Any) -> str:
    """The keys that set the world size, for the messages."""
    nnodes = getattr(cfg.launcher, "nnodes", 1)
    return "launcher.nproc_per_node" + ("" if str(nnodes) == "1" else " x launcher.nnodes")


def _global_batch(saved: dict[str, Any]) -> tuple[int, str]:
    """The saved run's global batch, and the sentence that says what it is made of."""
    batch, ranks, accumulation = saved["batch_size"], saved["world_size"], saved["accumulation"]
    global_batch = batch * ranks * accumulation
    return global_batch, (
        f"the global batch {global_batch} = batch_size {batch} x {_ranks(ranks)} x accumulation {accumulation}"
    )


def _batch_refusal(cfg: Any, world_size: int, saved: dict[str, Any], key: str) -> str | None:
    """Why no accumulation keeps the saved run's global batch on `world_size` data-parallel ranks
    (another batch_size, or a global batch that is not a multiple of batch_size x world_size),
    naming what would; None when one does."""
    batch, ranks = saved["batch_size"], saved["world_size"]
    global_batch, shape = _global_batch(saved)
    if cfg.batch_size != batch:
        keep = f"keep batch_size={batch}"
        if global_batch % (batch * world_size) == 0 and world_size != ranks:
            keep += f" (on {_ranks(world_size)} accumulation then becomes {global_batch // (batch * world_size)})"
        return (
            f"{key}: batch_size={cfg.batch_size} but the checkpoint was trained with batch_size={batch}; "
            f"a resumed run keeps its batch_size (what each forward sees) and {shape}: {keep}"
        )
    if global_batch % (batch * world_size):
        fits = [w for w in range(1, global_batch // batch + 1) if (global_batch // batch) % w == 0]
        return (
            f"{key}: the checkpoint was trained with {shape}, which this job's {_ranks(world_size)} "
            f"({_world_key(cfg)}) cannot keep: {global_batch} is not a multiple of batch_size {batch} x "
            f"{world_size} = {batch * world_size}. Resume on a world size that keeps it "
            f"({', '.join(map(str, fits))} ranks), or start afresh (checkpoint.resume=none)"
        )
    return None


def _resume_note(cfg: Any, world_size: int, saved: dict[str, Any], kept: int) -> str | None:
    """The line that says what keeping the global batch changed (the world size and the
    accumulation, or the configured accumulation); None when nothing did."""
    ranks, accumulation = saved["world_size"], saved["accumulation"]
    global_batch = _global_batch(saved)[0]
    if world_size != ranks:
        return (
            f"resume: world size {ranks} -> {world_size}, accumulation {accumulation} -> {kept} "
            f"keeps the global batch of {global_batch}"
        )
    if kept != cfg.accumulation:
        return (
            f"resume: accumulation={cfg.accumulation} -> {kept}, the checkpoint's, "
            f"keeps its global batch of {global_batch}"
        )
    return None


def _batch_fit(cfg: Any, layout: ParallelLayout, saved: dict[str, Any], key: str) -> ResumeFit:
    """The accumulation that keeps the saved run's global batch on the layout's data-parallel ranks,
    or why none does. The saved run's data-parallel size is its world size (each rank of a ddp,
    fsdp or hsdp run reads its own data)."""
    world_size = layout.dp_size
    refusal = _batch_refusal(cfg, world_size, saved, key)
    if refusal is not None:
        return ResumeFit(errors=[refusal])
    global_batch, shape = _global_batch(saved)
    kept = global_batch // (saved["batch_size"] * world_size)
    errors = []
    if kept > 1 and getattr(cfg, "compile", False) and cfg.compile_mode in CUDA_GRAPH_MODES:
        errors.append(
            f"{key}: keeping {shape} on {_ranks(world_size)} takes accumulation {kept}, but "
            f"compile_mode={cfg.compile_mode} replays CUDA graphs (accumulation 1 only): resume on "
            f"{_ranks(global_batch // saved['batch_size'])}, or use compile_mode=default"
        )
    return ResumeFit(errors=errors, accumulation=kept, note=_resume_note(cfg, world_size, saved, kept))


def batch_counts(record: Any) -> dict[str, int] | None:
    """The record's batch_size, world_size and accumulation, when it holds all three as ints >= 1."""
    if not isinstance(record, dict):
        return None
    values = {k: record.get(k) for k in ("batch_size", "world_size", "accumulation")}
    if all(type(v) is int and v >= 1 for v in values.values()):
        return values  # type: ignore[return-value]
    return None


def resume_fit(cfg: Any, layout: ParallelLayout, run_dir: Path | None) -> ResumeFit:
    """What the checkpoint a run will resume asks of it: errors, accumulation and a note.

    Errors: a checkpoint of another model or data, another batch_size, a world size that
    cannot keep its global batch, a checkpoint of the other `parallel` option, or an
    unreadable one named by path. With `latest` (or after a restart) the checkpoint checked is
    the newest whose metadata reads, the one the ranks fall back to when newer ones are
    damaged. After a restart by a launcher only the global batch is computed (the job resumes
    its own checkpoints; an elastic restart may have another world size).
    """
    unmarked = unmarked_errors(cfg, run_dir, layout)
    if unmarked:
        return ResumeFit(errors=unmarked)
    paths = _candidates(cfg, run_dir, layout)
    if not paths or not paths[0].exists():
        return ResumeFit(note=nothing_to_resume(cfg, run_dir, layout))
    restarted = restart_count() > 0
    for path in paths:
        key = f"checkpoint.resume={cfg.checkpoint.resume}"
        if Path(cfg.checkpoint.resume).expanduser() != path:  # latest, or a restart's newest: name it
            key += f" ({path})"
        kind = _kind_error(cfg, path, key, layout)
        if kind is not None:
            return ResumeFit(errors=[] if restarted else [kind])
        try:
            body = _read(path)
        except Exception as exc:  # CheckpointError (torch's side), OSError, ValueError
            reraise_interrupt(exc)
            if cfg.checkpoint.resume == "latest" or restarted:
                continue  # the ranks skip a damaged checkpoint for the one before it
            return ResumeFit(errors=[f"{key}: {path} cannot be resumed: {exc}"])
        return _fit(cfg, layout, body, key, restarted)
    return ResumeFit()  # none reads: the ranks' own verification decides (with `latest`, a fresh start)


def _fit(cfg: Any, layout: ParallelLayout, body: dict[str, Any], key: str, restarted: bool) -> ResumeFit:
    """`resume_fit` for one readable checkpoint (`body`: its metadata; `key`: how errors name it)."""
    saved = (body.get("state") or {}).get(RECORD_KEY) if isinstance(body.get("state"), dict) else None
    counts = batch_counts(saved)
    world_size = layout.dp_size  # the ranks that read data: a checkpoint's batch was read by its world size
    if counts is None:  # written by user code or an older clorch: no batch to keep
        if body.get("world_size") == world_size or restarted:
            return ResumeFit()
        return ResumeFit(
            errors=[
                f"{key}: the checkpoint was written by {_ranks(body.get('world_size'))}, this job has "
                f"{world_size}, and it does not record its batch_size and accumulation (not written by "
                f"clorch-train), so its global batch cannot be kept: resume with "
                f"{body.get('world_size')} ranks ({_world_key(cfg)}) or start afresh"
            ]
        )
    fit = _batch_fit(cfg, layout, counts, key)
    if restarted:
        return fit
    errors = list(fit.errors)
    now = run_record(cfg, layout.world_size)
    for name in ("model", "data"):
        recorded = saved.get(name)
        diff = _differences(recorded if isinstance(recorded, dict) else {}, now[name], f"{name}.")
        if diff:
            errors.append(
                f"{key}: the checkpoint holds another {name}: {', '.join(diff)}; "
                f"resume with the {name} it was trained with"
            )
    return replace(fit, errors=errors)


def _differences(saved: dict[str, Any], now: dict[str, Any], prefix: str) -> list[str]:
    keys = sorted(set(saved) | set(now))
    return [f"{prefix}{k}={now.get(k)!r} (checkpoint: {saved.get(k)!r})" for k in keys if saved.get(k) != now.get(k)]
