import time, torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from clorch.models import GPT, GPTConfig

def timeit(fn, n=20, warm=5):
    for _ in range(warm): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize(); return (time.perf_counter() - t) / n * 1e3

B, H, T, D = 16, 12, 1024, 64
q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
g = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                 ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
    try:
        def f():
            with sdpa_kernel(be):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y.backward(g)
        print(f"sdpa {name} fwd+bwd x12 layers: {12 * timeit(f):.2f} ms", flush=True)
    except Exception as e:
        print("sdpa", name, "failed", repr(e)[:200])

cfg = GPTConfig(vocab_size=50304, seq_len=1024, n_layer=12, n_head=12, d_model=768)
torch.manual_seed(0)
m = GPT(cfg).cuda()
opt = torch.optim.AdamW(m.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
x = torch.randint(0, 50304, (16, 1025), device="cuda")
def fb():
    with torch.autocast("cuda", torch.bfloat16):
        loss = F.cross_entropy(m(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
    loss.backward()
def step():
    fb(); opt.step(); opt.zero_grad(set_to_none=True)
for name, be in (("default", None), ("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
    for tf32 in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        def s():
            if be is None: step()
            else:
                with sdpa_kernel(be): step()
        print(f"eager step sdpa={name} tf32={tf32}: {timeit(s, 10, 3):.2f} ms", flush=True)
torch.backends.cuda.matmul.allow_tf32 = False
fb()
print(f"fused AdamW step alone: {timeit(lambda: opt.step(), 20, 3):.3f} ms")
def zero_copy():
    for p in m.parameters(): p.grad.clone()
print(f"clone of every grad (per-param): {timeit(zero_copy, 20, 3):.3f} ms")
flat = torch.zeros(sum(p.numel() for p in m.parameters()), device="cuda")
views = []; o = 0
for p in m.parameters(): views.append(flat[o:o + p.numel()].view_as(p)); o += p.numel()
grads = [p.grad for p in m.parameters()]
print(f"per-param copy into flat: {timeit(lambda: [v.copy_(g) for v, g in zip(views, grads)], 20, 3):.3f} ms")
print(f"foreach copy into flat: {timeit(lambda: torch._foreach_copy_(views, grads), 20, 3):.3f} ms")
print(f"flat div_: {timeit(lambda: flat.div_(2), 20, 3):.3f} ms")
print(f"flat zero_: {timeit(lambda: flat.zero_(), 20, 3):.3f} ms")
print(f"foreach add_ into flat: {timeit(lambda: torch._foreach_add_(views, grads), 20, 3):.3f} ms")

from clorch.data.text import lm_per_sample_loss
res = {}
for name, be in (("default", None), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
    torch._dynamo.reset()
    cm = torch.compile(m)
    def cstep():
        with torch.autocast("cuda", torch.bfloat16):
            loss = lm_per_sample_loss(cm(x[:, :-1]), x[:, 1:], compiled=True).mean()
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    def s():
        if be is None: cstep()
        else:
            with sdpa_kernel(be): cstep()
    t0 = time.time(); s(); s()
    res[name] = timeit(s, 20, 3)
    print(f"compiled step sdpa={name}: {res[name]:.2f} ms ({16384 / res[name] * 1e3:,.0f} tok/s, "
          f"MFU {16384 / res[name] * 1e3 * m.flops_per_token() / 989e12:.1%}; compile {time.time() - t0:.0f} s)", flush=True)
