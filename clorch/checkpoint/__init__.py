"""Rank-zero checkpoints: atomic on disk, verified and pickle-free on load.

    from clorch.checkpoint import save_checkpoint, load_checkpoint

    save_checkpoint(path, model=model, optimizer=optimizer, sampler=sampler,
                    scaler=scaler, state={"epoch": epoch, "step": step})
    state = load_checkpoint(path, model=model, optimizer=optimizer,
                            sampler=sampler, scaler=scaler)

See `clorch.checkpoint.api` for the on-disk layout and `clorch.checkpoint.policy`
for the engine's helpers (when to save, naming, latest valid, pruning).
"""

from __future__ import annotations

from clorch.checkpoint.api import CheckpointError, load_checkpoint, save_checkpoint, verify_checkpoint
from clorch.checkpoint.policy import (
    CheckpointPolicy,
    latest_checkpoint,
    prune_checkpoints,
    should_save,
    step_checkpoint_path,
)

__all__ = [
    "CheckpointError",
    "CheckpointPolicy",
    "latest_checkpoint",
    "load_checkpoint",
    "prune_checkpoints",
    "save_checkpoint",
    "should_save",
    "step_checkpoint_path",
    "verify_checkpoint",
]
