import sys, time, tempfile, torch
from pathlib import Path
from clorch.bench import runner as R
import clorch.distributed as cd

mode = sys.argv[1] if len(sys.argv) > 1 else "default"
opts = dict(preset="gpt2-small", batch_size=16, steps=10, rounds=5, warmup=5, log_every=10, compile=True,
            compile_mode=mode, device="cuda", peak_tflops=989.0)
with cd.process_group(backend="nccl"):
    device = cd.device()
    config, plain_model, clorch_model = R._models(opts, device)
    task = R.RandomTokens(128, config.seq_len, config.vocab_size)
    tmp = Path(tempfile.mkdtemp())
    run_c, writer = R._clorch_runner(clorch_model, task, opts, device, tmp)
    # the bare compiled step: model and loss compiled, one fixed batch on the GPU
    from clorch.data.text import lm_per_sample_loss
    cm = torch.compile(plain_model)
    opt = torch.optim.AdamW(plain_model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    x = task.data[:16].to(device)
    def run_b(steps):
        for _ in range(steps):
            with torch.autocast("cuda", torch.bfloat16):
                loss = lm_per_sample_loss(cm(x[:, :-1]), x[:, 1:], compiled=True).mean()
            loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    runs = {"bare": run_b, "clorch": run_c}
    for r in runs.values(): R._time_block(r, 5, device)
    s = {k: [] for k in runs}
    for i in range(6):
        for k in (runs if i % 2 == 0 else reversed(list(runs))):
            s[k].append(R._time_block(runs[k], 10, device) / 10 * 1e3)
    flops = plain_model.flops_per_token()
    for k, v in s.items():
        med = sorted(v)[len(v) // 2]
        print(f"{k}: median {med:.2f} ms/step, MFU {16384 / med * 1e3 * flops / 989e12:.1%}, samples {['%.2f' % t for t in v]}")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    import warnings
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        run_c(1); torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode(0)
    print("syncs in one clorch step:", len(w), [str(x.message)[:80] for x in w][:3])
    from torch.profiler import profile, ProfilerActivity
    for k in runs:
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            runs[k](4); torch.cuda.synchronize()
        ev = sorted([e for e in prof.events() if e.device_type.name == "CUDA"], key=lambda e: e.time_range.start)
        gaps = [b.time_range.start - a.time_range.end for a, b in zip(ev, ev[1:])]
        big = [g for g in gaps if g > 20]
        span = ev[-1].time_range.end - ev[0].time_range.start
        busy = sum(e.time_range.end - e.time_range.start for e in ev)
        print(f"{k}: 4 steps span {span/1e3:.2f} ms, kernel time {busy/1e3:.2f} ms, gaps>20us {len(big)} totalling {sum(big)/1e3:.2f} ms, all gaps {sum(g for g in gaps if g > 0)/1e3:.2f} ms")
        top = prof.key_averages().table(sort_by="cuda_time_total", row_limit=12)
        print(top[:4000])
