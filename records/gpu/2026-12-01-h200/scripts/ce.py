"""Cross-entropy over GPT-2-small logits (16 x 1024 x 50304, bf16) under torch.compile: which
formulation makes the fastest kernels; then whole compiled steps with each, interleaved, with the
GPU's clocks, power and temperature sampled between blocks."""
import collections, subprocess, sys, time
import torch
import torch.nn.functional as F
from clorch.models import GPT, GPTConfig

B, T, V = 16, 1024, 50304
dev = torch.device("cuda")

def ce_none(logits, target):
    return F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="none").view_as(target).float().mean(dim=1)

def lse_gather(logits, target):
    lf = logits.float()
    per = torch.logsumexp(lf, dim=-1) - lf.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return per.mean(dim=1)

def compiled(fn, mode):
    return torch.compile(fn, mode=None if mode == "default" else mode)

LOSSES = {
    "ce": compiled(ce_none, "default"),
    "ce_tuned": compiled(ce_none, "max-autotune-no-cudagraphs"),
    "lse": compiled(lse_gather, "default"),
    "lse_tuned": compiled(lse_gather, "max-autotune-no-cudagraphs"),
}

def clocks():
    q = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"
    return subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.strip()

def timed(fn, n):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3

def loss_micro():
    g = torch.Generator(device=dev).manual_seed(0)
    logits = (torch.randn(B, T, V, device=dev, generator=g) * 2).bfloat16().requires_grad_()
    target = torch.randint(0, V, (B, T), device=dev, generator=g)
    ref = None
    fns = {}
    for name, loss in LOSSES.items():
        def run(loss=loss):
            logits.grad = None
            loss(logits, target).mean().backward()
        run(); run()
        out = loss(logits, target).mean().item()
        logits.grad = None; loss(logits, target).mean().backward(); grad = logits.grad.float()
        if ref is None: ref = (out, grad)
        print(f"loss {name}: value {out:.6f} (|d| {abs(out - ref[0]):.2e}), grad max |d| {(grad - ref[1]).abs().max().item():.2e}", flush=True)
        fns[name] = run
    s = collections.defaultdict(list)
    for r in range(10):
        for k in (list(fns) if r % 2 == 0 else list(reversed(fns))):
            s[k].append(timed(fns[k], 5))
    for k, v in s.items():
        print(f"loss {k}: fwd+bwd median {sorted(v)[len(v)//2]:.3f} ms")
    from torch.profiler import profile, ProfilerActivity
    for k, fn in fns.items():
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn(); torch.cuda.synchronize()
        ks = [(e.name, (e.time_range.end - e.time_range.start) / 1e3) for e in prof.events() if e.device_type.name == "CUDA"]
        print(f"  {k} kernels: " + "; ".join(f"{n[:60]} {d:.3f}" for n, d in ks))
    del logits

def steps():
    cfg = GPTConfig(vocab_size=V, seq_len=T, n_layer=12, n_head=12, d_model=768)
    data = torch.randint(0, V, (B, T + 1), generator=torch.Generator().manual_seed(0)).to(dev)
    x, y = data[:, :-1], data[:, 1:]
    variants = {}
    for name in ("ce", "lse", "ce_tuned"):
        torch.manual_seed(0)
        model = GPT(cfg).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
        cm = torch.compile(model)
        loss = LOSSES[name]
        def step(n, cm=cm, loss=loss, opt=opt):
            for _ in range(n):
                with torch.autocast("cuda", torch.bfloat16):
                    l = loss(cm(x), y).mean()
                l.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        t = time.perf_counter(); step(3); torch.cuda.synchronize()
        print(f"step {name}: compiled in {time.perf_counter() - t:.0f} s", flush=True)
        variants[name] = step
    flops = model.flops_per_token()
    s = collections.defaultdict(list)
    for r in range(10):
        print("  clocks:", clocks(), flush=True)
        for k in (list(variants) if r % 2 == 0 else list(reversed(variants))):
            s[k].append(timed(lambda k=k: variants[k](1), 10))
    print("  clocks:", clocks())
    for k, v in s.items():
        med = sorted(v)[len(v) // 2]
        print(f"step {k}: median {med:.2f} ms MFU {B * T / med * 1e3 * flops / 989e12:.1%} samples {[round(t, 2) for t in v]}")

print("clocks at start:", clocks())
loss_micro()
torch.cuda.empty_cache()
steps()
