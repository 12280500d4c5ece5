"""The engine: the launching process, where a checked launch plan (clorch.plan.plan) becomes a multi-rank job.

The code each rank runs (its components, loop, evaluation, checkpoints) is clorch.train.

api.py         run_local(): compose, check, launch, wait, report, from Python
run.py         execute(plan, run_dir): launch, follow, report
summary.py     config.yaml and env.json at the start, summary.json and loss.png at the end
results.py     the typed records: a rank's result, the job's end, summary.json, execute()'s result
as_rank.py     one rank of an outside launcher's job (torchrun, srun, submitit): the launching
               process's part done in the rank, around clorch.train.worker
rank_end.py    how the ranks of an outside launcher's job end: rank 0 writes summary.json
interrupts.py  signals: a final checkpoint, then a clean stop
outputs.py     run directory contents; progress.py the launching process's progress view
tracking.py    experiment trackers fed from metrics.jsonl
footprint.py   what a launch adds to its run directory, and who else is using it
sweep.py       the multirun summary (CSV and Markdown)
"""

from __future__ import annotations

from clorch.engine.api import run_local

__all__ = ["run_local"]
