"""clorch's compiled GPT-2 small step: inductor's default vs coordinate_descent_tuning, interleaved."""
import sys, tempfile, time
from pathlib import Path

import torch

from clorch.bench import runner as R
from clorch.bench.gpuclock import GpuMonitor, describe
from clorch.bench.stats import median

opts = vars(R.parser().parse_args(["--compile", "--rounds", "10", "--batch-size", sys.argv[1] if len(sys.argv) > 1 else "16"]))
device = torch.device("cuda", 0)
torch.cuda.set_device(device)
config, model_a, model_b = R._models(opts, device)
task = R.RandomTokens(max(64, opts["batch_size"] * 8), config.seq_len, config.vocab_size)
tokens = opts["batch_size"] * config.seq_len
real_compile = torch.compile
t0 = time.time()
with tempfile.TemporaryDirectory() as tmp:
    runs = {}
    (Path(tmp) / "a").mkdir(); (Path(tmp) / "b").mkdir()
    run, wa = R._clorch_runner(model_a, task, opts, device, Path(tmp) / "a")
    R._time_block(run, opts["warmup"], device)
    runs["default"] = run
    print(f"default compiled in {time.time() - t0:.0f} s", flush=True)

    def cdt_compile(model, mode=None, **kw):
        return real_compile(model, options={"coordinate_descent_tuning": True}, **kw)

    torch.compile = cdt_compile
    t1 = time.time()
    run, wb = R._clorch_runner(model_b, task, opts, device, Path(tmp) / "b")
    R._time_block(run, opts["warmup"], device)
    torch.compile = real_compile
    runs["coordinate descent"] = run
    print(f"cdt compiled in {time.time() - t1:.0f} s", flush=True)
    samples = {n: [] for n in runs}
    with GpuMonitor(device, interval_ms=200) as mon:
        for r in range(opts["rounds"]):
            for name in (list(runs) if r % 2 == 0 else list(reversed(runs))):
                samples[name].append(tokens * opts["steps"] / R._time_block(runs[name], opts["steps"], device))
    flops = model_a.flops_per_token()
    for name, v in samples.items():
        tps = median(v)
        print(f"{name}: {tps:,.0f} tokens/s, MFU {100 * tps * flops / 989e12:.1f}%  blocks {[round(x / 1e3) for x in v]}")
    print("ratio cdt/default", median(samples["coordinate descent"]) / median(samples["default"]))
    print(describe(mon.summary(), mon.problem))
    wa.close(); wb.close()
