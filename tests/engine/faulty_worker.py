"""A rank entry point for tests: the engine's worker, with one rank exiting abruptly after a step.

`run_failing(run_dir, fail_at_step, overrides)` composes and resolves as
`clorch.run_local` does, then launches this module's `main` instead of
`clorch.train.worker:main`. The last rank leaves with `FAIL_EXIT_CODE`
right after optimizer step `fail_at_step` of the job's first attempt (a
restart by the launcher trains on), like a crash: no cleanup, no group
teardown. The step travels in an environment variable the ranks inherit.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Mapping

from clorch.train.worker import StepHooks, plan_of, train
from clorch.env import restart_count

FAIL_EXIT_CODE = 17
FAIL_AT_STEP_VARIABLE = "CLORCH_TESTS_FAIL_AT_STEP"


class FailingHooks(StepHooks):
    def __call__(self, state, result) -> None:
        super().__call__(state, result)
        step = int(os.environ[FAIL_AT_STEP_VARIABLE])
        first_attempt = restart_count() == 0  # clorch's launcher or torchrun's agent
        if state.step == step and first_attempt and self.parts.rank == self.parts.world_size - 1:
            print(f"exiting on purpose after step {step}", flush=True)
            sys.stderr.flush()
            os._exit(FAIL_EXIT_CODE)


def main(ctx: Mapping[str, Any]) -> dict[str, Any] | None:
    return train(plan_of(ctx), Path(ctx["args"]["run_dir"]), ctx, hooks_class=FailingHooks)


def run_failing(run_dir: Path, fail_at_step: int, monkeypatch, **kwargs: Any) -> dict[str, Any]:
    """`clorch.run_local(run_dir=run_dir, **kwargs)` (progress off unless given) whose last rank fails once."""
    from clorch.config.checks import ConfigError
    from clorch.config.overrides import compose_once
    from clorch.engine.api import overrides_for
    from clorch.plan.plan import resolve
    from clorch.engine.run import execute

    monkeypatch.setenv(FAIL_AT_STEP_VARIABLE, str(fail_at_step))
    recipe = kwargs.pop("recipe", "ddp_bf16")
    progress = kwargs.pop("progress", "off")
    cfg, errors = compose_once(overrides_for(None, None, recipe, kwargs))
    if errors:
        raise ConfigError(errors)
    plan = resolve(cfg, run_dir)
    return execute(plan, run_dir, progress=progress, echo=False, worker=f"{__name__}:main")
