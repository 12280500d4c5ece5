"""How much an output layer and its loss cost GPT-2 small, compiled, and so how much a fused
output layer and loss can save at most: peak memory and step time of

* `plain`: clorch's compiled path (the compiled model's logits, then its compiled cross-entropy);
* `chunked-N`: `loss=chunked_cross_entropy` with N tokens a chunk;
* `no-output`: the same model without an output layer (a stand-in loss on the hidden states),
  the floor that no fused loss can go below;

then the output layer's three matrix products alone (forward, and the two of backward), so that
`no-output + products` bounds the step time of a perfect fused loss.

    python scripts/probe_output_layer.py [--batch-size 16] [--layers 12] [--chunks 2048,4096]

One model resident at a time (peaks are above its weights, gradients and optimizer state);
CUDA only; medians of `--steps` timed steps after `--warmup`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from clorch.models.gpt import GPT, GPTConfig
from clorch.nn.fused_loss import fuse_output_loss


def _step_fn(model, variant: str):
    if variant.startswith("chunked"):
        fuse_output_loss(model, int(variant.split("-")[1]))
        compiled = torch.compile(model)
        return lambda idx, tgt: compiled(idx, target=tgt)
    if variant == "no-output":
        hidden = torch.compile(model.forward_hidden)
        return lambda idx, tgt: hidden(idx).float().square().mean()
    compiled = torch.compile(model)
    loss = torch.compile(lambda logits, tgt: F.cross_entropy(logits.flatten(0, 1), tgt.flatten()))
    return lambda idx, tgt: loss(compiled(idx), tgt)


def measure(config: GPTConfig, variant: str, batch: int, warmup: int, steps: int) -> tuple[float, float]:
    """(median step ms, peak GiB above the resident state) of one variant."""
    torch.manual_seed(0)
    model = GPT(config).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    forward = _step_fn(model, variant)
    idx = torch.randint(0, config.vocab_size, (batch, config.seq_len), device="cuda")
    tgt = torch.roll(idx, -1, 1)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = forward(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    resident = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), (torch.cuda.max_memory_allocated() - resident) / 2**30


def output_products_ms(config: GPTConfig, batch: int, steps: int) -> float:
    """Median ms of the output layer's forward product and its two backward products, bf16."""
    tokens, d, v = batch * config.seq_len, config.d_model, config.vocab_size
    h = torch.randn(tokens, d, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(v, d, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(tokens, v, device="cuda", dtype=torch.bfloat16)
    times = []
    for _ in range(steps + 3):
        torch.cuda.synchronize()
        t = time.perf_counter()
        h @ w.t(), g @ w, g.t() @ h
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times[3:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--chunks", default="2048,4096")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--peak-tflops", type=float, default=989.0)
    a = p.parse_args()
    config = GPTConfig(vocab_size=50304, seq_len=1024, n_layer=a.layers, n_head=12, d_model=768)
    flops = a.batch_size * config.seq_len * GPT(config).flops_per_token()  # as the runner counts MFU
    variants = ["plain", *(f"chunked-{c}" for c in a.chunks.split(",") if c), "no-output"]
    rows = {}
    for variant in variants:
        ms, peak = measure(config, variant, a.batch_size, a.warmup, a.steps)
        torch._dynamo.reset()  # drop the compiled graphs, and with them the last model
        torch.cuda.empty_cache()
        rows[variant] = (ms, peak)
        mfu = flops / (ms * 1e-3) / (a.peak_tflops * 1e12)
        print(f"{variant:14s} step {ms:7.2f} ms  MFU {mfu:6.1%}  peak above resident {peak:6.2f} GiB", flush=True)
    products = output_products_ms(config, a.batch_size, a.steps)
    bound_ms = rows["no-output"][0] + products
    print(f"output layer's three products alone: {products:.2f} ms")
    print(
        f"a perfect fused loss: at most {rows['plain'][1] - rows['no-output'][1]:.2f} GiB less than plain; "
        f"at best {bound_ms:.2f} ms a step, MFU {flops / (bound_ms * 1e-3) / (a.peak_tflops * 1e12):.1%}"
    )


if __name__ == "__main__":
    main()
