"""`clorch-bench fsdp`: a GPT training step sharded by clorch vs a hand-written fully_shard loop.

Both candidates train the same GPT on the same random tokens over the same
mesh of every rank, interleaved round by round (the order rotates):

* `clorch fsdp`: the model built on the meta device, `clorch.nn.parallel.fsdp.shard_model`
  (the GPT's blocks, the mixed-precision policy of `--precision`), `materialize`, AdamW,
  clorch's `clip_grad_norm_`.
* `torch fully_shard`: the loop a user writes from torch's FSDP2 tutorial: `fully_shard`
  on each block and the root with the same `MixedPrecisionPolicy`, `to_empty` and GPT-2's
  init, AdamW, `torch.nn.utils.clip_grad_norm_`.

A sample is the mean time of `--steps` optimizer steps (forward, loss, backward,
clip, step, zero_grad), ranks aligned by a barrier first; the table gives rank
0's medians, tokens/s of the whole job and clorch / torch. `--compile` compiles
each block and the root with torch.compile in both candidates.

Run: `clorch-bench fsdp` (2 CPU ranks, a tiny GPT), `clorch-bench fsdp --model gpt2-small
--device cuda --precision bf16 --compile --nproc 1`, or under torchrun:
`torchrun --standalone --nproc-per-node 2 -m clorch.bench.fsdp ...`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

import clorch.distributed as cd
from clorch.bench.stats import format_table, interleave, median, ratio
from clorch.bench.jobs import run_and_print_table
from clorch.models.gpt import GPT, GPTConfig
from clorch.nn.parallel.fsdp import (
    clip_grad_norm_,
    device_mesh,
    gpt_init_fn,
    materialize,
    mixed_precision_policy,
    shard_model,
)

MODELS = {
    "gpt-tiny": GPTConfig(vocab_size=256, seq_len=64, n_layer=2, n_head=2, d_model=64),
    "gpt2-small": GPTConfig(vocab_size=50304, seq_len=1024, n_layer=12, n_head=12, d_model=768),
}
CLORCH, TORCH = "clorch fsdp", "torch fully_shard"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="clorch-bench fsdp", description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(MODELS), default="gpt-tiny", help="the GPT's sizes")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu: gloo ranks; cuda: nccl")
    p.add_argument(
        "--precision",
        choices=("fp32", "bf16"),
        default="fp32",
        help="bf16: parameters gathered and computed in bf16, gradients reduced in fp32",
    )
    p.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps per timed sample")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    p.add_argument("--compile", action="store_true", help="torch.compile each block and the root")
    p.add_argument("--nproc", type=int, default=2, help="ranks to start when not under a launcher")
    return p


def _compiled(model: torch.nn.Module, on: bool) -> None:
    if on:
        for block in model.blocks:
            block.compile()
        model.compile()


def _clorch_model(config: GPTConfig, args: dict, device: torch.device) -> torch.nn.Module:
    with torch.device("meta"):
        model = GPT(config)
    shard_model(model, mesh=device_mesh(device.type), precision=args["precision"])
    materialize(model, device, seed=0, init_fn=gpt_init_fn(model))
    _compiled(model, args["compile"])
    return model


def _torch_model(config: GPTConfig, args: dict, device: torch.device) -> torch.nn.Module:
    """What a user writes with torch's FSDP2 directly."""
    with torch.device("meta"):
        model = GPT(config)
    mesh = device_mesh(device.type)
    policy = mixed_precision_policy(args["precision"])
    kwargs = {"mesh": mesh, **({"mp_policy": policy} if policy is not None else {})}
    for block in model.blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, reshard_after_forward=False, **kwargs)
    model.to_empty(device=device)
    with torch.no_grad():
        model.apply(model._init_weights)
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.reset_parameters()
    _compiled(model, args["compile"])
    return model


def _candidate(model, clip, tokens: torch.Tensor, steps: int, sync):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=tokens.is_cuda)

    def run() -> float:
        cd.barrier()
        sync()
        start = time.perf_counter()
        for _ in range(steps):
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
            loss.backward()
            clip(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        sync()
        return (time.perf_counter() - start) / steps

    return run


def worker(ctx: dict) -> dict:
    """One rank's benchmark; rank 0's result holds the table. Collective: every rank runs it."""
    args = ctx["args"]
    device = torch.device("cuda", cd.local_rank()) if args["device"] == "cuda" else torch.device("cpu")
    config = MODELS[args["model"]]
    generator = torch.Generator().manual_seed(cd.rank())
    tokens = torch.randint(0, config.vocab_size, (args["batch"], config.seq_len + 1), generator=generator).to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    candidates = {
        CLORCH: _candidate(_clorch_model(config, args, device), clip_grad_norm_, tokens, args["steps"], sync),
        TORCH: _candidate(
            _torch_model(config, args, device), torch.nn.utils.clip_grad_norm_, tokens, args["steps"], sync
        ),
    }
    interleave(candidates, args["warmup"])
    samples = interleave(candidates, args["rounds"])
    medians = {name: median(values) for name, values in samples.items()}
    tokens_per_step = args["batch"] * config.seq_len * cd.world_size()
    rows = [
        [name, medians[name] * 1e3, tokens_per_step / medians[name], ratio(medians[TORCH], medians[name])]
        for name in medians
    ]
    title = (
        f"FSDP2 training step, GPT {args['model']}, {cd.world_size()} ranks, {args['device']}, "
        f"{args['precision']}{', compiled' if args['compile'] else ''}, {args['rounds']} rounds x "
        f"{args['steps']} steps (rank 0)"
    )
    table = title + "\n" + format_table(["candidate", "median ms/step", "tokens/s", "speed / torch"], rows)
    return {"table": table, "medians_s": medians, "ratio_clorch_torch": ratio(medians[TORCH], medians[CLORCH])}


def _args(ns: argparse.Namespace) -> dict:
    return {
        key: getattr(ns, key)
        for key in ("model", "device", "precision", "batch", "rounds", "steps", "warmup", "compile")
    }


def _check(ns: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    errors = [
        f"--{name} must be >= {low}, got {getattr(ns, name)}"
        for name, low in (("batch", 1), ("rounds", 1), ("steps", 1), ("warmup", 0), ("nproc", 1))
        if getattr(ns, name) < low
    ]
    if ns.device == "cuda" and not torch.cuda.is_available():
        errors.append("--device cuda: no CUDA device here (HINT: --device cpu for a smoke run)")
    if errors:
        p.error("; ".join(errors))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = parser()
    ns = p.parse_args(argv)
    _check(ns, p)
    backend = "nccl" if ns.device == "cuda" else "gloo"
    if os.environ.get("RANK") is not None:  # under torchrun or another launcher
        with cd.process_group(backend=backend):
            rank, result = cd.rank(), worker({"args": _args(ns)})
        if rank == 0:
            print(result["table"])
        return 0
    return run_and_print_table(
        "clorch.bench.fsdp:worker",
        nproc=ns.nproc,
        backend=backend,
        devices=list(range(ns.nproc)) if ns.device == "cuda" else None,
        args=_args(ns),
        timeout=3600,
    )


if __name__ == "__main__":
    sys.exit(main())
