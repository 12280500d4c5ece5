"""Child process of the crash tests: save a first checkpoint, then start a second and get killed.

Usage: python -m tests.checkpoint.crash_writer DIR FIRST SECOND MODE [PAUSE_SPEC]

MODE "pause": the second save stops at the point named in PAUSE_SPEC
("point:signal_file", see clorch.checkpoint.atomic.test_pause) until the test
kills it. MODE "loop": after the first save, keep saving to SECOND with weights
that change every time, until killed at a moment the test picks.
Weights: seed 1 for the first save, seeds 2, 3, ... afterwards.
"""

from __future__ import annotations

import os
import sys

import torch

from clorch.checkpoint import save_checkpoint
from clorch.checkpoint.atomic import TEST_HOOK_VARIABLE


def model(seed: int) -> torch.nn.Module:
    """About 1 MB of weights: several writes, so a kill can land between two of them."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 256))


def main(argv: list[str]) -> None:
    directory, first, second, mode = argv[:4]
    save_checkpoint(os.path.join(directory, first), model=model(1), state={"seed": 1})
    if mode == "pause":
        os.environ[TEST_HOOK_VARIABLE] = argv[4]
        save_checkpoint(os.path.join(directory, second), model=model(2), state={"seed": 2})
        raise SystemExit("the pause point was never reached")
    print("first saved", flush=True)
    seed = 2
    while True:
        save_checkpoint(os.path.join(directory, second), model=model(seed), state={"seed": seed})
        seed += 1


if __name__ == "__main__":
    main(sys.argv[1:])
