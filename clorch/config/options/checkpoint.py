"""The `checkpoint` group: when to write checkpoints, where, and where to resume from."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

from clorch._checkpoint_names import any_step_checkpoints
from clorch.config.registry import Option, declare, option, rule
from clorch.env import restart_count

declare("checkpoint", "when to write checkpoints and where to resume from", selector="policy")


@option("checkpoint", "none")
@option("checkpoint", "final", policy="final")
@option("checkpoint", "periodic", policy="periodic", every_n_steps=50)
@dataclass
class CheckpointConfig(Option):
    """When to write checkpoints and where to resume from."""

    policy: Literal["none", "final", "periodic"] = "none"  # none | final (at the end) | periodic (+ final)
    dir: Optional[str] = field(
        default=None, metadata=rule(path=True)
    )  # checkpoint directory; null is <run dir>/checkpoints
    # the final checkpoint (a directory under parallel=fsdp); null is <dir>/final.ckpt (final.dcp)
    path: Optional[str] = field(default=None, metadata=rule(path=True))
    every_n_steps: int = field(default=0, metadata=rule(ge=0, unit="steps"))  # periodic: steps between checkpoints
    keep_last: int = field(default=2, metadata=rule(ge=1))  # periodic: how many step checkpoints to keep
    resume: str = field(default="none", metadata=rule(path=True))  # none | latest (newest in dir) | a checkpoint file
    export: Literal["none", "safetensors"] = (
        "none"  # safetensors: the final weights as model.safetensors in the run directory
    )

    def rules(self, cfg: Any) -> list[str]:
        errors = self._unused_keys()
        if self.policy == "periodic" and self.every_n_steps < 1:
            errors.append(f"checkpoint.every_n_steps must be >= 1 with checkpoint=periodic, got {self.every_n_steps}")
        # resume=latest with checkpoint.dir null resumes from <run dir>/checkpoints, the default
        # directory: hydra.run.dir=<a run> goes on in place (none there yet: a fresh start, as torch's
        # and Lightning's "last" do).
        if self.resume not in ("none", "latest") and not Path(self.resume).expanduser().exists():
            errors.append(
                f"checkpoint.resume={self.resume!r}: no such checkpoint "
                "(allowed: none, latest, or an existing checkpoint path)"
            )
        if self.resume == "none" and self.policy == "periodic" and self.dir is not None:
            errors += reused_dir_errors("checkpoint.dir", self.dir)
        launcher = cfg.launcher
        if launcher is not None and launcher.max_restarts > 0 and self.policy != "periodic":
            errors.append(
                f"launcher.max_restarts={launcher.max_restarts} resumes from the latest "
                f"checkpoint: use checkpoint=periodic (got checkpoint={self.policy})"
            )
        return errors

    def _unused_keys(self) -> list[str]:
        """Keys that the chosen policy would ignore: a run that silently writes no checkpoint
        is found out only after the interrupt that was meant to be safe."""
        defaults = CheckpointConfig()
        writes = {"none": set(), "final": {"path"}, "periodic": {"path", "every_n_steps", "keep_last"}}
        used = writes[self.policy] | ({"dir"} if self.policy != "none" or self.resume == "latest" else set())
        errors = []
        for key in ("dir", "path", "every_n_steps", "keep_last"):
            value = getattr(self, key)
            if key in used or value == getattr(defaults, key):
                continue
            needs = "periodic" if key in ("every_n_steps", "keep_last") else "final or checkpoint=periodic"
            errors.append(
                f"checkpoint.{key}={value!r} does nothing with checkpoint={self.policy}: "
                f"it writes no {'step ' if needs == 'periodic' else ''}checkpoints; "
                f"choose checkpoint={needs}"
            )
        return errors


def reused_dir_errors(key: str, directory: str | os.PathLike) -> list[str]:
    """An error when a new run would write step checkpoints beside an earlier run's.

    Pruning keeps the highest step numbers and resume=latest takes the highest,
    so the two runs' checkpoints would mix. Only the launching process checks
    this, before launch: the launcher's restarts (CLORCH_RESTART_COUNT > 0)
    resume from the job's own checkpoints and are not refused.
    """
    if restart_count() > 0:
        return []
    found = sorted(path.name for _, path in any_step_checkpoints(Path(directory).expanduser()))
    if not found:
        return []
    shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
    return [
        f"{key}={str(directory)} already holds checkpoints ({shown}); pass "
        "checkpoint.resume=latest to continue that run, or choose an empty directory"
    ]
