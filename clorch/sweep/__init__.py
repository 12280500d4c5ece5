"""Sweeps: `clorch-train -m` with clorch's grid and Optuna sweepers (docs/sweeps.md).

    settings.py      the sweepers' keys (hydra.sweeper.*), typed, with their defaults
    algorithms.py    samplers and pruners by name, with their arguments by name, checked
    space.py         a search space in Hydra's grammar, read into Optuna's distributions
    checks.py        a sweep read from its command line and checked before any trial
    slots.py         which GPUs or cores each side-by-side trial gets
    pool.py          trials side by side, each a clorch-train process of its own
    driver.py        the loop: start trials while there is room, read each that ends
    directory.py     the sweep directory: its lock (one sweep at a time), its identity (sweep.json)
    storage.py       where the Optuna study lives, checked to be this sweep's; storage errors in a line
    heartbeat.py     which running trials are cut off, and which run live in another sweep
    enqueue.py       known-good trials asked first (hydra.sweeper.enqueue), checked against the space
    warm_source.py   the earlier sweep a warm start reads (hydra.sweeper.warm_start), checked without Optuna
    warm_start.py    its finished trials added to the study, once; this sweep's trial numbers kept
    study.py         the Optuna study a sweep asks for trials and tells of their ends
    run.py           what the sweepers (hydra_plugins.clorch_sweepers) do in `sweep()`
    objectives.py    one objective or several (hydra.sweeper.objective, direction); the Pareto front
    summary.py       sweep_summary.csv/.md: one row per trial
    report.py        the sweep's end: its summary, its best trial, its plots, its exit status
    best.py          the best trial as a recipe (SWEEP_DIR/best.yaml)
    errors.py        SweepRefused, StorageError
    _private_apis.py every private API of Hydra and Optuna the sweep leans on, in one room

The rank's side of a trial (reporting each eval, pruning) is clorch.train.trial.
"""
