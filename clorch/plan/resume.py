"""Before launch: does the checkpoint to resume fit this run (model, world size, batch size)?

Each checkpoint the engine writes records the run that wrote it (`run_record`)
in its state; a resume with a different model, number of ranks or batch
would fail inside the ranks (a shape or sampler mismatch) or, for the batch
size, silently change what an epoch and a step mean. These are reported with
the other config errors instead.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from clorch._checkpoint_names import step_checkpoints
from clorch.config.schema import TargetModelConfig
from clorch.env import restart_count

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


def _candidate(cfg: Any, run_dir: Path | None) -> Path | None:
    """The checkpoint the ranks will start from, as the launching process sees it now."""
    ckpt = cfg.checkpoint
    if ckpt.resume == "none":
        return None
    if ckpt.resume != "latest":
        return Path(ckpt.resume).expanduser()
    # The newest step checkpoint by name: its metadata is all this check reads. Rank 0
    # verifies the archive when it resumes (and falls back to an older one of the same run).
    directory = Path(ckpt.dir).expanduser() if ckpt.dir else (run_dir / "checkpoints" if run_dir else None)
    found = step_checkpoints(directory) if directory is not None else []
    return found[0][1] if found else None


def _differences(saved: dict[str, Any], now: dict[str, Any], prefix: str) -> list[str]:
    keys = sorted(set(saved) | set(now))
    return [f"{prefix}{k}={now.get(k)!r} (checkpoint: {saved.get(k)!r})" for k in keys if saved.get(k) != now.get(k)]


def resume_errors(cfg: Any, world_size: int, run_dir: Path | None) -> list[str]:
    """Errors for a resume whose checkpoint was written by a different run shape.

    Restarts by a launcher (CLORCH_RESTART_COUNT > 0) resume their own job's
    checkpoints and are not checked again.
    """
    if restart_count() > 0:
        return []
    path = _candidate(cfg, run_dir)
    if path is None or not path.is_file():
        return []
    # lazy: clorch.checkpoint.errors imports torch, kept out of clorch-train's start
    from clorch.checkpoint.errors import CheckpointError

    # lazy: clorch.checkpoint.metadata imports torch, kept out of clorch-train's start
    from clorch.checkpoint.metadata import read

    key = f"checkpoint.resume={cfg.checkpoint.resume}"
    try:
        body = read(path)
    except (CheckpointError, OSError) as exc:
        if cfg.checkpoint.resume == "latest":
            return []  # the ranks skip a damaged newest checkpoint for the one before it
        return [f"{key}: {path} cannot be resumed: {exc}"]
    errors = []
    if body["world_size"] != world_size:
        errors.append(
            f"{key}: {path} was written by {body['world_size']} rank(s), this job has "
            f"{world_size}; each rank resumes its own sampler position, so resume with "
            f"{body['world_size']} ranks (launcher.nproc_per_node) or start afresh"
        )
    saved = (body.get("state") or {}).get(RECORD_KEY)
    if not isinstance(saved, dict):
        return errors  # written by an older clorch, or by user code: nothing more to compare
    now = run_record(cfg, world_size)
    for name in ("batch_size", "accumulation"):
        if saved.get(name) != now[name]:
            errors.append(
                f"{key}: {name}={now[name]} but the checkpoint was trained with "
                f"{name}={saved.get(name)}; a resumed run continues in the same steps "
                f"and epochs, so keep {name}={saved.get(name)}"
            )
    for name in ("model", "data"):
        recorded = saved.get(name)
        diff = _differences(recorded if isinstance(recorded, dict) else {}, now[name], f"{name}.")
        if diff:
            errors.append(
                f"{key}: the checkpoint holds another {name}: {', '.join(diff)}; "
                f"resume with the {name} it was trained with"
            )
    return errors
