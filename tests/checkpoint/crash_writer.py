"""Child process of the crash tests: save a first checkpoint, then start a second and get killed.

Usage: python -m tests.checkpoint.crash_writer DIR FIRST SECOND MODE [POINT SIGNAL_FILE]

MODE "pause": the second save stops at POINT (mid_archive, before_commit,
after_commit) until the test kills it; reaching it creates SIGNAL_FILE, the
test's sign that the writer is there. The pause is injected here, by wrapping
the checkpoint module's own functions (the product has no test hook).
MODE "loop": after the first save, keep saving to SECOND with weights that
change every time, until killed at a moment the test picks.
Weights: seed 1 for the first save, seeds 2, 3, ... afterwards.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

from clorch.checkpoint import api, archive, save_checkpoint

# Bytes of the archive written before "mid_archive" pauses: some, not all, of it is on disk.
_MID_ARCHIVE_BYTES = 64 << 10


def model(seed: int) -> torch.nn.Module:
    """About 1 MB of weights: several writes, so a kill can land between two of them."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 256))


def _pause(point: str, signal_file: str) -> None:
    """Tell the test we are at `point`, then wait to be killed."""
    Path(signal_file).write_text(point)
    while True:
        time.sleep(1)


def inject_pause(point: str, signal_file: str) -> None:
    """Make the next save stop forever at `point` (see the module docstring)."""
    if point == "mid_archive":
        write = archive.HashingWriter.write

        def paused_write(self, data):
            written = write(self, data)
            if self.written >= _MID_ARCHIVE_BYTES:
                _pause(point, signal_file)
            return written

        archive.HashingWriter.write = paused_write
    elif point in ("before_commit", "after_commit"):
        commit = api.commit

        def paused_commit(temporary, target):
            if point == "before_commit":
                _pause(point, signal_file)
            commit(temporary, target)
            _pause(point, signal_file)  # after the rename, before the superseded files are deleted

        api.commit = paused_commit
    else:
        raise SystemExit(f"unknown pause point {point!r}")


def main(argv: list[str]) -> None:
    directory, first, second, mode = argv[:4]
    save_checkpoint(os.path.join(directory, first), model=model(1), state={"seed": 1})
    if mode == "pause":
        inject_pause(argv[4], argv[5])
        save_checkpoint(os.path.join(directory, second), model=model(2), state={"seed": 2})
        raise SystemExit("the pause point was never reached")
    print("first saved", flush=True)
    seed = 2
    while True:
        save_checkpoint(os.path.join(directory, second), model=model(seed), state={"seed": seed})
        seed += 1


if __name__ == "__main__":
    main(sys.argv[1:])
