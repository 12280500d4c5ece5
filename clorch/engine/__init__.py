"""The engine: a composed config becomes a multi-rank job.

    api.py         run_local(): compose, launch, wait, report, from Python
    run.py         execute(cfg, run_dir): validate, resolve, launch, follow, write outputs
    resolve.py     auto settings (backend, ranks, devices) and the step plan
    worker.py      the per-rank entry point, clorch.engine.worker:main(ctx)
    components.py  build_components(cfg, ctx): model (DDP), optimizer, schedule, scaler, data
    loop.py        train_step() and fit()
    evaluate.py    exact held-out metrics across ranks
    checkpoints.py checkpoint policy and resume
    outputs.py     run directory contents; progress.py the launching process's progress view
    sweep.py       the multirun summary (CSV and Markdown)
"""

from __future__ import annotations

from clorch.engine.api import run_local

__all__ = ["run_local"]
