"""The code each rank runs: its components, loop, evaluation and checkpoints.

clorch.engine is the launching process: it writes the plan, starts the ranks and
reports their end; every rank runs `clorch.train.worker:main(ctx)` on the plan it reads.

worker.py           the per-rank entry point: read the plan, build, train, evaluate, save
components.py       build_components(cfg, ctx, steps): model, optimizer, schedule, precision, data
loop.py             train_step() and fit()
evaluate.py         exact held-out metrics across ranks
checkpoints.py      checkpoint policy and resume
preflight.py        the machines' checks before training (preflight=true|only)
metrics.py          metrics.jsonl and events.jsonl: what rank 0 writes while it trains
trial.py            a sweep trial's side in a rank: each evaluation reported, pruning
batch_statistics.py the warning when a world size change alters batch statistics
"""
