"""The names of step checkpoints (`step_00000100.ckpt`; sharded: `step_00000100.dcp/`), read
without importing torch.

The config checks (a directory that already holds another run's checkpoints, the
checkpoint a resume would take) and the interrupt's resume hint list them in the
launching process, before any rank starts; clorch.checkpoint re-exports both functions.
"""

from __future__ import annotations

import re
from pathlib import Path

from clorch._args import int_arg as _int_arg

STEP_NAME = re.compile(r"step_(\d{8,})\.ckpt")
# A sharded step checkpoint (clorch.checkpoint.sharded): a directory, committed once it holds
# clorch.json (written last).
SHARDED_STEP_NAME = re.compile(r"step_(\d{8,})\.dcp")
SHARDED_MARKER = "clorch.json"


def step_checkpoint_path(directory: str | Path, step: int) -> Path:
    """`directory / "step_00000100.ckpt"` for step 100 (zero-padded so names sort by step).

    Raises:
        TypeError / ValueError: step is not an int >= 0.
    """
    return Path(directory) / f"step_{_int_arg('step', step, 0):08d}.ckpt"


def step_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of the committed-looking step checkpoints in `directory`, newest first.

    Names only: nothing is read or verified (see `clorch.checkpoint.latest_checkpoint`).
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := STEP_NAME.fullmatch(p.name)) and p.is_file()]
    return sorted(found, reverse=True)


def any_step_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """`step_checkpoints` and the committed sharded step checkpoints (parallel=fsdp), newest first.

    Names only (and a sharded one's clorch.json being there): nothing is read or verified.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    sharded = [
        (int(m.group(1)), p)
        for p in directory.iterdir()
        if (m := SHARDED_STEP_NAME.fullmatch(p.name)) and (p / SHARDED_MARKER).is_file()
    ]
    return sorted(step_checkpoints(directory) + sharded, reverse=True)
