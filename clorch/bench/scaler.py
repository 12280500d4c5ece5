"""`clorch-bench scaler`: clorch.amp.GradScaler vs torch.amp.GradScaler, unscale + overflow check.

Both scalers see the same gradients (GPT-2-small-like shapes by default:
embeddings, 12 blocks of attention and MLP weights, LayerNorms) and run one
full step each round: unscale with the fused multi-tensor kernel, the
overflow decision (a host read) and the scale update; the optimizer's own
step is a no-op so only the scaler is timed. Before each sample the gradients
are restored (untimed), so values never drift. Candidates alternate round by
round; the table gives median milliseconds per step and clorch / torch.

Runs on CUDA when available (timing synchronizes the device), else on the CPU
(a smaller model unless --layers is given). Goal: clorch / torch <= 1.0.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from clorch.amp import GradScaler
from clorch.bench.stats import format_table, interleave, median, ratio


class _NoStep(torch.optim.Optimizer):
    """Holds the parameters; step() does nothing, so only the scaler is measured."""

    def __init__(self, params):
        super().__init__(params, {})

    def step(self, closure=None):
        return None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="clorch-bench scaler", description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=None, help="transformer blocks (default 12 on CUDA, 4 on CPU)")
    p.add_argument("--width", type=int, default=768, help="model width")
    p.add_argument("--rounds", type=int, default=30, help="alternating rounds")
    p.add_argument("--steps", type=int, default=10, help="scaler steps per timed sample")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    return p


def _shapes(layers: int, width: int) -> list[tuple[int, ...]]:
    shapes: list[tuple[int, ...]] = [(50304, width), (1024, width)]
    for _ in range(layers):
        shapes += [
            (width,),
            (width,),
            (3 * width, width),
            (3 * width,),
            (width, width),
            (width,),
            (width,),
            (width,),
            (4 * width, width),
            (4 * width,),
            (width, 4 * width),
            (width,),
        ]
    return shapes + [(width,), (width,)]


def _params(shapes, device, dtype) -> tuple[list[torch.nn.Parameter], list[torch.Tensor]]:
    gen = torch.Generator(device="cpu").manual_seed(0)
    params, grads = [], []
    for shape in shapes:
        params.append(torch.nn.Parameter(torch.empty(shape, device=device, dtype=dtype)))
        grads.append((torch.randn(shape, generator=gen) * 1024).to(device=device, dtype=dtype))
    return params, grads


def _candidate(step_once, params, source, steps, sync):
    def run() -> float:
        torch._foreach_copy_([p.grad for p in params], source)
        sync()
        start = time.perf_counter()
        for _ in range(steps):
            step_once()
        sync()
        return (time.perf_counter() - start) / steps

    return run


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(sys.argv[1:] if argv is None else argv)
    device = ns.device if ns.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: CUDA is not available on this machine", file=sys.stderr)
        return 2
    layers = ns.layers if ns.layers is not None else (12 if device == "cuda" else 4)
    dtype = torch.float32  # torch's GradScaler refuses fp16 gradients ("Attempting to unscale FP16")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    candidates = {}
    numel = 0
    for name in ("clorch", "torch"):
        params, source = _params(_shapes(layers, ns.width), device, dtype)
        numel = sum(p.numel() for p in params)
        for p, g in zip(params, source):
            p.grad = g.clone()
        opt = _NoStep(params)
        # growth_interval is huge and gradients finite, so the scale stays put
        # both speak torch's call sequence: step(optimizer), then update()
        make = GradScaler if name == "clorch" else torch.amp.GradScaler
        scaler = make(device, init_scale=1024.0, growth_interval=1 << 30)
        step_once = lambda s=scaler, o=opt: (s.step(o), s.update())  # noqa: E731
        scaler.scale(torch.tensor(2.0, device=device))  # creates the scale tensor (torch requires it)
        candidates[name] = _candidate(step_once, params, source, ns.steps, sync)
    interleave(candidates, 3)  # warm-up
    samples = interleave(candidates, ns.rounds)
    medians = {name: median(values) for name, values in samples.items()}
    print(
        f"GradScaler step (unscale + overflow check + update), {len(_shapes(layers, ns.width))} "
        f"tensors, {numel / 1e6:.1f}M fp32 gradients on {device}, {ns.rounds} rounds x {ns.steps} steps"
    )
    rows = [[name, medians[name] * 1e3, ratio(medians[name], medians["torch"])] for name in medians]
    print(format_table(["scaler", "median ms/step", "/ torch"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
