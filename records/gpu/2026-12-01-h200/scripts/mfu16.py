"""Where a compiled GPT-2-small step (batch 16 x 1024, bf16 autocast, fused AdamW) spends its
GPU time, and whether compiling model and loss as one graph is faster than two graphs."""
import re, sys, time, collections
import torch
from clorch.models import GPT, GPTConfig
from clorch.data.text import lm_per_sample_loss, _lm_per_sample_loss

B = int(sys.argv[1]) if len(sys.argv) > 1 else 16
cfg = GPTConfig(vocab_size=50304, seq_len=1024, n_layer=12, n_head=12, d_model=768)
dev = torch.device("cuda")
gen = torch.Generator().manual_seed(0)
data = torch.randint(0, 50304, (B, 1025), generator=gen).to(dev)
x, y = data[:, :-1], data[:, 1:]

def make(kind):
    torch.manual_seed(0)
    model = GPT(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    if kind == "sep":
        cm = torch.compile(model)
        def loss_fn():
            return lm_per_sample_loss(cm(x), y, compiled=True).mean()
    elif kind == "joint":
        f = torch.compile(lambda a, b: _lm_per_sample_loss(model(a), b, None).mean())
        def loss_fn():
            return f(x, y)
    def step(n):
        for _ in range(n):
            with torch.autocast("cuda", torch.bfloat16):
                loss = loss_fn()
            loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    return model, step

def timed(step, n):
    torch.cuda.synchronize(); t = time.perf_counter(); step(n); torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3

variants = {}
for k in ("sep", "joint"):
    t = time.perf_counter()
    model, step = make(k)
    step(3); torch.cuda.synchronize()
    print(f"{k}: compiled and warmed in {time.perf_counter() - t:.0f} s", flush=True)
    variants[k] = step
flops = model.flops_per_token()
samples = collections.defaultdict(list)
for r in range(8):
    for k in (list(variants) if r % 2 == 0 else list(reversed(variants))):
        samples[k].append(timed(variants[k], 10))
for k, v in samples.items():
    med = sorted(v)[len(v) // 2]
    print(f"{k}: median {med:.2f} ms/step MFU {B * 1024 / med * 1e3 * flops / 989e12:.1%} samples {[round(s, 2) for s in v]}")

from torch.profiler import profile, ProfilerActivity
def category(name):
    n = name.lower()
    if "nvjet" in n or "gemm" in n or "cutlass" in n or "sm90_xmma" in n: return "gemm"
    if "sdpa" in n or "attention" in n or "flash" in n or "fmha" in n: return "attention"
    if "adam" in n: return "optimizer"
    if n.startswith("triton_"): return "triton " + ("reduction" if "_red_" in n or "_per_" in n else "pointwise")
    if "embedding" in n or "index" in n or "scatter" in n or "sort" in n or "radix" in n: return "embedding/index"
    if "memcpy" in n or "memset" in n or "fill" in n or "copy" in n: return "copy/fill"
    return "other"
for k, step in variants.items():
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step(3); torch.cuda.synchronize()
    per = collections.Counter(); names = collections.Counter(); calls = collections.Counter()
    for e in prof.events():
        if e.device_type.name != "CUDA": continue
        d = (e.time_range.end - e.time_range.start) / 1e3 / 3
        per[category(e.name)] += d; names[e.name] += d; calls[e.name] += 1
    print(f"--- {k}: GPU ms per step by kind (total {sum(per.values()):.2f})")
    for c, d in per.most_common(): print(f"  {c:22s} {d:7.2f}")
    print(f"  top kernels:")
    for n_, d in names.most_common(25): print(f"  {d:7.3f} ms x{calls[n_] // 3:3d}  {n_[:110]}")
