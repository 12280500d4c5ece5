"""`clorch-train` whose ranks exit abruptly after optimizer step CLORCH_TESTS_FAIL_AT_STEP.

Started by torchrun on one "node" of a test, so that a rank fails there while
the other node's ranks run the real `clorch-train`. With CLORCH_TESTS_FAIL_RANK=R
only rank R fails, and by raising (RuntimeError), as a bug in a training step would.
"""

from __future__ import annotations

import os
import sys

import clorch.train.worker as worker
from clorch.cli import train_main

_train = worker.train


class _Failing(worker.StepHooks):
    def __call__(self, state, result) -> None:
        super().__call__(state, result)
        if state.step != int(os.environ["CLORCH_TESTS_FAIL_AT_STEP"]):
            return
        only = os.environ.get("CLORCH_TESTS_FAIL_RANK")
        if only is None:
            print(f"exiting on purpose after step {state.step}", flush=True)
            os._exit(17)
        if int(only) == self.parts.rank:
            raise RuntimeError(f"failing on purpose after step {state.step}")


def _train_failing(plan, run_dir, ctx, hooks_class=worker.StepHooks):
    return _train(plan, run_dir, ctx, hooks_class=_Failing)


if __name__ == "__main__":
    worker.train = _train_failing  # clorch.engine.as_rank reads worker.train when it trains
    sys.exit(train_main())
