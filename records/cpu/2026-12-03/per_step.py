"""Each loop one step in turn on 2 gloo ranks (MASTER_ADDR/PORT, RANK, WORLD_SIZE=2 set by hand); rank 0 prints
the per-step medians. Run from the repository root, one process per rank."""
import os, sys, tempfile, time, statistics
from pathlib import Path
import torch
from clorch.bench import runner, runner_dataset
import clorch.distributed as cd
p = runner.parser()
opts = vars(p.parse_args(["--device","cpu","--preset","tiny","--data","dataset","--batch-size","32","--steps","1","--rounds","1","--warmup","5","--log-every","10"]))
with cd.process_group(backend="gloo"):
    dev=torch.device("cpu")
    config, pm, cm = runner._models(opts, dev)
    _, pm2, cm2 = runner._models(opts, dev)
    task = runner.RandomTokens(256, config.seq_len, config.vocab_size)
    ds = runner_dataset.TokenWindows.written(task.data, f"/tmp/tok{cd.rank()}.bin")
    with tempfile.TemporaryDirectory() as tmp:
        fns = {"plain-ds": runner_dataset.plain_runner(runner._torch_ddp(pm, dev), ds, opts, dev),
               "plain-t": runner._plain_runner(runner._torch_ddp(pm2, dev), task, opts, dev)}
        os.makedirs(Path(tmp)/"a", exist_ok=True); os.makedirs(Path(tmp)/"b", exist_ok=True)
        fns["clorch-ds"], w1 = runner._clorch_runner(cm, runner_dataset.clorch_task(ds, opts, dev), opts, dev, Path(tmp)/"a")
        os.makedirs(Path(tmp)/"a", exist_ok=True)
        fns["clorch-t"], w2 = runner._clorch_runner(cm2, task, opts, dev, Path(tmp)/"b")
        for f in fns.values(): f(5)
        times = {k: [] for k in fns}
        for r in range(300):
            for k, f in fns.items():
                t0 = time.perf_counter(); f(1); times[k].append(time.perf_counter() - t0)
        if cd.rank() == 0:
            for k, v in times.items():
                v2 = sorted(v)
                print(f"{k:10s} median {statistics.median(v)*1e3:.2f} ms  mean {statistics.mean(v)*1e3:.2f}  p90 {v2[int(.9*len(v2))]*1e3:.2f}  max {v2[-1]*1e3:.2f}")
