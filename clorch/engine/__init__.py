"""The engine: a checked launch plan (clorch.plan.plan) becomes a multi-rank job.

api.py         run_local(): compose, check, launch, wait, report, from Python
run.py         execute(plan, run_dir): launch, follow, report (the launching process)
summary.py     config.yaml and env.json at the start, summary.json and loss.png at the end
results.py     the typed records: a rank's result, the job's end, summary.json, execute()'s result
as_rank.py     one rank of an outside launcher's job (torchrun, srun, submitit)
worker.py      the per-rank entry point, clorch.engine.worker:main(ctx)
components.py  build_components(cfg, ctx, steps): model, optimizer, schedule, precision, data
parallel.py    the `parallel` options' builders: the model in clorch's DDP, or sharded (fully_shard)
loop.py        train_step() and fit()
evaluate.py    exact held-out metrics across ranks
checkpoints.py checkpoint policy and resume
preflight.py   the machines' checks before training (preflight=true|only)
interrupts.py  signals: a final checkpoint, then a clean stop
outputs.py     run directory contents; progress.py the launching process's progress view
tracking.py    experiment trackers fed from metrics.jsonl
footprint.py   what a launch adds to its run directory, and who else is using it
sweep.py       the multirun summary (CSV and Markdown)
"""

from __future__ import annotations

from clorch.engine.api import run_local

__all__ = ["run_local"]
