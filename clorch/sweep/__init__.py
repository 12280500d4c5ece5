"""Sweeps: `clorch-train -m` with clorch's grid and Optuna sweepers (docs/sweeps.md).

    settings.py   the sweepers' keys (hydra.sweeper.*), typed, with their defaults
    space.py      a search space in Hydra's grammar, read into Optuna's distributions
    checks.py     a sweep read from its command line and checked before any trial
    slots.py      which GPUs or cores each side-by-side trial gets
    pool.py       trials side by side, each a clorch-train process of its own
    driver.py     the loop: start trials while there is room, read each that ends
    study.py      the Optuna study a sweep asks for trials and tells of their ends
    run.py        what the sweepers (hydra_plugins.clorch_sweepers) do in `sweep()`

The rank's side of a trial (reporting each eval, pruning) is clorch.train.trial.
"""
