"""`clorch-train`: compose (Hydra), validate, launch, report.

    clorch-train                                  a small default job
    clorch-train +recipe=ddp_bf16 optim.lr=3e-4   a recipe plus overrides
    clorch-train -m +recipe=ddp_bf16 optim.lr=1e-3,3e-4   a sweep
    clorch-train --help                           recipes, groups and the default config
    clorch-train +recipe=ddp_bf16 --cfg job       the composed config, checked without torch
    clorch-train --version                        clorch's, torch's and Hydra's versions

Each run gets a directory of its own, outputs/DATE/TIME (TIME-1, TIME-2, ...
when several runs start in the same second); sweeps get multirun/DATE/TIME.
Every config error is reported together, before anything launches, and the
command exits with status 2 (leaving no run directory behind); a failed job (a failed
preflight too, on every node) exits with 1, an interrupted one with 128 + the signal:
each status's code and console line are clorch.status.Status's.

    train.py        the console script: flags, refusals, who runs the job
    hydra_app.py    the Hydra job (one run, or one job of a sweep) and running Hydra in-process
    outcome.py      what the runs of one command came to, and its exit status
    run_dir.py      the run directory made before Hydra starts, and taken back on a config error
    hydra_flags.py  Hydra's own flags, whole and first
    hydra_keys.py   the Hydra keys a user may set, and where outputs may go
"""

from __future__ import annotations

from clorch.cli.train import main, train_main

__all__ = ["main", "train_main"]
