"""`clorch-bench ddp`: clorch's DDP reducer vs torch's DDP vs one process without communication.

Per rank, the same model and the same batch train under each candidate,
interleaved round by round (the order rotates): clorch's
DistributedDataParallel, clorch's with reduce_dtype="bf16", clorch's with
gradient_as_bucket_view=True (backward accumulates into the buckets), clorch's with
the optimizer stepped bucket by bucket in backward (`step_in_backward`), torch's
DistributedDataParallel with the same bucket cap (as constructed by default,
with gradient_as_bucket_view=True and static_graph=True, and with torch's
bf16_compress_hook, the peer of reduce_dtype="bf16"), and the bare model (no
communication: what one process would cost). At world size 1, where clorch's
DDP runs no reducer, two more candidates run the whole bucket path anyway
(`clorch DDP bucket path`: copies into buckets, each bucket all-reduced to the
rank itself; `... grad views` with gradient_as_bucket_view=True), and the bare
model with an empty Python hook on every parameter (`one process, empty Python
hooks`: the cost of calling Python once per gradient, a floor for any reducer
whose hooks are Python). On CUDA, `... overlapped copies` candidates run with
`overlap_grad_copies=True` (new gradients copied per bucket on a side stream).
A candidate's sample is the mean
step time (forward, backward, reduction, optimizer step, zero_grad) of a few
steps; the table gives rank 0's medians and the ratios, followed by clorch /
torch DDP step time and the scaling efficiency (one-process step time / N-rank
step time at the same per-rank batch).

Workloads (`--model`, see `clorch.bench.ddp_models`):

* `mlp` (default): an MLP of about 6M parameters, fp32, SGD, 64 rows per rank.
* `gpt2-small`: GPT-2 small (124M parameters), random tokens, bf16 autocast,
  AdamW (fused on CUDA), 8 x 1024 tokens per rank (`--batch` sequences).
* `gpt-tiny`: a 2-layer GPT with the same code path, for a CPU smoke run.

`--device cpu` (default) runs gloo ranks; `--device cuda` runs nccl ranks, one
GPU each (ranks 0..N-1 on GPUs 0..N-1).

Run: `clorch-bench ddp` (starts 2 ranks with clorch's launcher),
`clorch-bench ddp --model gpt2-small --device cuda --nproc 2`, or
`torchrun --standalone --nproc-per-node 2 -m clorch.bench.ddp [--device cuda ...]`.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import clorch.distributed as cd
from clorch.bench.jobs import run_and_print_table
from clorch.bench import ddp_models
from clorch.bench.gpuclock import GpuMonitor, describe
from clorch.bench.stats import format_table, interleave, median, ratio
from clorch.bench.trace import profile_step
from clorch.amp import MixedPrecision
from clorch.nn.parallel import DistributedDataParallel
from clorch.strategies import adopt

DEFAULTS = {
    "width": 2048,
    "features": 512,
    "batch": 64,
    "rounds": 15,
    "steps": 3,
    "warmup": 3,
    "bucket_cap_mb": 25.0,
    "threads": 1,
    "model": "mlp",
    "device": "cpu",
    "gpu_sample_ms": 0,
    "trace": None,
}
TORCH_BF16 = "torch DDP bf16_compress_hook"
EMPTY_HOOKS = "one process, empty Python hooks"  # world size 1: the floor for Python gradient hooks
TRACED = (
    "clorch DDP",
    "clorch DDP bucket path",
    "clorch DDP bucket path grad views",
    "clorch DDP bucket path overlapped copies",
    "clorch DDP step_in_backward",
    "torch DDP best",
    "one process",
)  # those present are traced


# The command line, one row per flag: (flag, argparse keywords, help).
_FLAGS = (
    (
        "--model",
        dict(choices=ddp_models.MODELS, default=DEFAULTS["model"]),
        "workload: the MLP, GPT-2 small, or a tiny GPT for smoke runs",
    ),
    (
        "--device",
        dict(choices=("cpu", "cuda"), default=DEFAULTS["device"]),
        "cpu: gloo ranks; cuda: nccl ranks, one GPU each",
    ),
    ("--width", dict(type=int, default=DEFAULTS["width"]), "hidden width of the MLP"),
    ("--features", dict(type=int, default=DEFAULTS["features"]), "input/output width of the MLP"),
    (
        "--batch",
        dict(type=int, default=None),
        "per rank per step: rows for the MLP (default 64), sequences for a GPT (default 8)",
    ),
    ("--rounds", dict(type=int, default=DEFAULTS["rounds"]), "interleaved rounds"),
    ("--steps", dict(type=int, default=DEFAULTS["steps"]), "steps per timed sample"),
    ("--warmup", dict(type=int, default=DEFAULTS["warmup"]), "untimed rounds first"),
    (
        "--bucket-cap-mb",
        dict(type=float, default=DEFAULTS["bucket_cap_mb"]),
        "bucket cap (MiB) for clorch's and torch's DDP",
    ),
    (
        "--gpu-sample-ms",
        dict(type=int, default=DEFAULTS["gpu_sample_ms"]),
        "CUDA: sample the GPU's clock and power with nvidia-smi every N ms (0, the "
        "default: off; a second process that wakes often speeds up the host-bound "
        "candidates on some machines, so these figures are taken without it)",
    ),
    ("--threads", dict(type=int, default=DEFAULTS["threads"]), "torch threads per rank"),
    ("--nproc", dict(type=int, default=2), "ranks to start when not under a launcher"),
    (
        "--trace",
        dict(default=None, metavar="DIR"),
        "after timing, profile one step of each DDP candidate on every rank: Chrome "
        "traces DIR/rank<R>-<candidate>.json.gz and the exposed communication per step",
    ),
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="clorch-bench ddp", description=__doc__.splitlines()[0])
    for flag, options, text in _FLAGS:
        p.add_argument(flag, **options, help=text)
    return p


def _candidate(forward, optimizer, step, loss, steps, sync):
    """One sample: mean seconds per training step over `steps` steps, ranks aligned first."""

    def run() -> float:
        cd.barrier()
        sync()
        start = time.perf_counter()
        for _ in range(steps):
            loss(forward).backward()
            step(optimizer)
        sync()  # CUDA work is asynchronous: the clock stops when the GPU is done
        return (time.perf_counter() - start) / steps

    def one_step() -> None:
        loss(forward).backward()
        step(optimizer)

    run.one_step = one_step  # what --trace profiles
    return run


def _plain_step(optimizer):
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _empty_hook(param: torch.Tensor) -> None:
    """A gradient hook that does nothing: what calling Python once per gradient costs by itself."""


def _register_hook(model: torch.nn.parallel.DistributedDataParallel, hook) -> None:
    """Register torch's comm `hook` on `model`. torch refuses its bf16_compress_hook by name unless
    it was built with CUDA and NCCL 2.10+ (NCCL's bf16 all-reduce), even for gloo, which reduces
    bf16 in any build: there the same function is registered under a name of its own."""
    try:
        model.register_comm_hook(None, hook)
    except TypeError:
        if hook is not default_hooks.bf16_compress_hook:
            raise

        def bf16_compress_on_gloo(state, bucket):  # no annotations: torch checks them as its own types
            return default_hooks.bf16_compress_hook(state, bucket)

        model.register_comm_hook(None, bf16_compress_on_gloo)


def _clorch_variants(one_rank: bool, cuda: bool) -> list[tuple[str, dict]]:
    """Which settings of clorch's DDP are measured here: (candidate name, `_clorch_ddp` keywords)."""
    rows = [("clorch DDP", {})]
    if one_rank:  # clorch's DDP skips the reducer there: measure the bucket path too
        rows += [
            ("clorch DDP bucket path", dict(bucket_path=True)),
            ("clorch DDP bucket path grad views", dict(bucket_path=True, gradient_as_bucket_view=True)),
        ]
    if cuda:
        name = "clorch DDP bucket path overlapped copies" if one_rank else "clorch DDP overlapped copies"
        rows.append((name, dict(bucket_path=one_rank, overlap_grad_copies=True)))
    rows += [
        ("clorch DDP bf16", dict(reduce_dtype="bf16")),
        ("clorch DDP grad views", dict(gradient_as_bucket_view=True)),
        ("clorch DDP step_in_backward", dict(stepping=True)),
    ]
    if cuda:
        rows.append(("clorch DDP step_in_backward overlapped copies", dict(stepping=True, overlap_grad_copies=True)))
    return rows


# Which settings of torch's DDP are measured: (candidate name, `_torch_ddp` keywords).
_TORCH_VARIANTS = (
    ("torch DDP", {}),
    # torch's DDP in its fastest documented settings: gradients live in the buckets, graph reused.
    ("torch DDP best", dict(gradient_as_bucket_view=True, static_graph=True)),
    # The peer of clorch's bf16 buckets: torch's DDP with its bf16 compression hook.
    (TORCH_BF16, dict(hook=default_hooks.bf16_compress_hook)),
)


def _clorch_ddp(work, cap, device, bucket_path: bool = False, stepping: bool = False, **options):
    """clorch's DDP around a copy of the workload's model, stepped by its strategy: (model, optimizer, step)."""
    model = DistributedDataParallel(copy.deepcopy(work.model), bucket_cap_mb=cap, **options)
    if bucket_path:
        model._run_bucket_path()
    optimizer = work.optimizer(model.module)
    if stepping:
        model.step_in_backward(optimizer)
    # fp32 to the precision object: a workload's bf16 is its loss's autocast, no loss scaler.
    strategy = adopt(model, model.module, optimizer, MixedPrecision("fp32", device), device)
    return model, optimizer, lambda _: strategy.optimizer_step()


def _torch_ddp(work, cap, device, hook=None, **options):
    """torch's DDP around a copy of the workload's model: (model, optimizer, step)."""
    ids = [device.index] if device.type == "cuda" else None
    model = torch.nn.parallel.DistributedDataParallel(
        copy.deepcopy(work.model), device_ids=ids, bucket_cap_mb=cap, **options
    )
    if hook is not None:
        _register_hook(model, hook)
    return model, work.optimizer(model.module), _plain_step


def _no_communication(work, one_rank: bool) -> list[tuple]:
    """The floors no reducer goes under: one process, and at world size 1 the same model with an
    empty Python hook on every parameter (the floor for any reducer built on Python gradient hooks)."""
    single = copy.deepcopy(work.model)
    rows = [("one process", single, work.optimizer(single), _plain_step)]
    if one_rank:
        hooked = copy.deepcopy(work.model)
        for param in hooked.parameters():
            param.register_post_accumulate_grad_hook(_empty_hook)
        rows.append((EMPTY_HOOKS, hooked, work.optimizer(hooked), _plain_step))
    return rows


def _candidates(args: dict, rank: int) -> tuple[dict, ddp_models.Workload]:
    device = cd.device()
    work = ddp_models.build(args, rank, device)
    cap, one_rank = args["bucket_cap_mb"], cd.world_size() == 1
    built = [
        (name, *_clorch_ddp(work, cap, device, **options))
        for name, options in _clorch_variants(one_rank, device.type == "cuda")
    ]
    built += [(name, *_torch_ddp(work, cap, device, **options)) for name, options in _TORCH_VARIANTS]
    built += _no_communication(work, one_rank)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    candidates = {
        name: _candidate(model, optimizer, step, work.loss, args["steps"], sync)
        for name, model, optimizer, step in built
    }
    return candidates, work


def _summary(medians: dict, world_size: int, tokens_per_step: int | None) -> str:
    """clorch / torch DDP step time, then the scaling efficiency of each DDP candidate."""
    lines = [
        f"clorch DDP / torch DDP step time: {ratio(medians['clorch DDP'], medians['torch DDP']):.4f}",
        f"clorch DDP / torch DDP best (gradient_as_bucket_view, static_graph) step time: "
        f"{ratio(medians['clorch DDP'], medians['torch DDP best']):.4f}",
        f"clorch DDP step_in_backward / torch DDP best step time: "
        f"{ratio(medians['clorch DDP step_in_backward'], medians['torch DDP best']):.4f}",
        f"clorch DDP bf16 / {TORCH_BF16} step time: {ratio(medians['clorch DDP bf16'], medians[TORCH_BF16]):.4f}",
    ]
    ddp = [name for name in medians if not name.startswith("one process")]
    eff = ", ".join(f"{name} {ratio(medians['one process'], medians[name]):.4f}" for name in ddp)
    lines.append(
        f"scaling efficiency (one-process step time / {world_size}-rank step time, same per-rank batch): {eff}"
    )
    if tokens_per_step:
        tps = ", ".join(f"{name} {world_size * tokens_per_step / medians[name]:,.0f}" for name in ddp)
        lines.append(f"tokens/s over {world_size} rank(s): {tps}")
    return "\n".join(lines)


def _traces(candidates: dict, directory: str, rank: int) -> str:
    """Profile one step of each traced candidate (every rank, same order); rank 0's figures as a table."""
    rows = []
    for name in (name for name in TRACED if name in candidates):
        path = Path(directory) / f"rank{rank}-{name.replace(' ', '_')}.json.gz"
        cd.barrier()
        figures = profile_step(candidates[name].one_step, path)
        rows.append(
            [
                name,
                figures["busy_us"] / 1e3,
                figures["compute_us"] / 1e3,
                figures["comm_us"] / 1e3,
                figures["exposed_comm_us"] / 1e3,
            ]
        )
    if not any(row[1] for row in rows):
        return f"one profiled step per candidate in {directory} (no device kernels on CPU: open them in Perfetto)"
    return f"one profiled step per candidate (torch.profiler, rank {rank}; traces in {directory})\n" + format_table(
        ["candidate", "device busy ms", "compute ms", "communication ms", "exposed communication ms"], rows
    )


def _table(medians: dict, work: ddp_models.Workload, args: dict, ctx: dict) -> str:
    """Rank 0's table: each candidate's median step time and its ratios to torch's DDP and to one
    process, under a title that says what ran; a GPT's summary lines after it."""
    rows = [
        [
            name,
            medians[name] * 1e3,
            ratio(medians[name], medians["torch DDP"]),
            ratio(medians[name], medians["one process"]),
        ]
        for name in medians
    ]
    title = (
        f"DDP step, {work.description}, {ctx['world_size']} ranks, {ctx['backend']}, bucket_cap_mb "
        f"{args['bucket_cap_mb']}, {args['rounds']} rounds x {args['steps']} steps (rank 0)"
    )
    table = title + "\n" + format_table(["candidate", "median ms/step", "/ torch DDP", "/ one process"], rows)
    if args["model"] != "mlp":  # the MLP's output stays as it was
        table += "\n" + _summary(medians, ctx["world_size"], work.tokens_per_step)
    return table


def worker(ctx: dict) -> dict:
    """One rank's benchmark (every rank runs it); returns rank 0's table and medians.

    Every rank must call it: DDP construction, each synchronized backward and
    the barrier before each sample are collectives across the job.
    """
    args = {**DEFAULTS, **(ctx.get("args") or {})}
    if args["batch"] is None:
        args["batch"] = ddp_models.default_batch(args["model"])
    torch.set_num_threads(args["threads"])
    candidates, work = _candidates(args, ctx["rank"])
    interleave(candidates, args["warmup"])
    device = next(work.model.parameters()).device
    with GpuMonitor(device, interval_ms=args["gpu_sample_ms"]) as monitor:
        samples = interleave(candidates, args["rounds"])
    medians = {name: median(values) for name, values in samples.items()}
    table = _table(medians, work, args, ctx)
    if device.type == "cuda" and args["gpu_sample_ms"]:
        table += "\n" + describe(monitor.summary(), monitor.problem)
    if args["trace"]:
        table += "\n" + _traces(candidates, args["trace"], ctx["rank"])
    return {
        "table": table,
        "medians_s": medians,
        "params": sum(p.numel() for p in work.model.parameters()),
        "ratio_clorch_torch": ratio(medians["clorch DDP"], medians["torch DDP"]),
        "ratio_clorch_torch_best": ratio(medians["clorch DDP"], medians["torch DDP best"]),
        "ratio_overlap_torch_best": ratio(medians["clorch DDP step_in_backward"], medians["torch DDP best"]),
        "ratio_bf16_torch_bf16": ratio(medians["clorch DDP bf16"], medians[TORCH_BF16]),
        "scaling_efficiency": {
            name: ratio(medians["one process"], medians[name]) for name in medians if name != EMPTY_HOOKS
        },
    }


def _argv_args(ns: argparse.Namespace) -> dict:
    args = {key: getattr(ns, key) for key in DEFAULTS}
    if args["batch"] is None:
        args["batch"] = ddp_models.default_batch(args["model"])
    return args


def _check(ns: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """Every bad argument at once, before any rank starts."""
    errors = [
        f"--{name.replace('_', '-')} must be >= {low}, got {getattr(ns, name)}"
        for name, low in (
            ("batch", 1),
            ("rounds", 1),
            ("steps", 1),
            ("warmup", 0),
            ("threads", 1),
            ("nproc", 1),
            ("width", 2),
            ("features", 1),
            ("gpu_sample_ms", 0),
        )
        if getattr(ns, name) is not None and getattr(ns, name) < low
    ]
    if not ns.bucket_cap_mb > 0:
        errors.append(f"--bucket-cap-mb must be > 0 (MiB), got {ns.bucket_cap_mb}")
    if ns.device == "cuda" and not torch.cuda.is_available():
        errors.append("--device cuda: no CUDA device here (HINT: --device cpu --model gpt-tiny for a smoke run)")
    elif ns.device == "cuda" and "RANK" not in os.environ and ns.nproc > torch.cuda.device_count():
        errors.append(
            f"--nproc must be <= the visible GPU count ({torch.cuda.device_count()}) with --device cuda, got {ns.nproc}"
        )
    if errors:
        p.error("; ".join(errors))


def _under_launcher(ns: argparse.Namespace) -> int:
    with cd.process_group(backend="nccl" if ns.device == "cuda" else "gloo"):
        ctx = {
            "rank": cd.rank(),
            "local_rank": cd.local_rank(),
            "world_size": cd.world_size(),
            "backend": cd.backend(),
            "process_group": None,
            "args": _argv_args(ns),
        }
        result = worker(ctx)
    if ctx["rank"] == 0:
        print(result["table"])
    return 0


def _launch(ns: argparse.Namespace) -> int:
    cuda = ns.device == "cuda"
    return run_and_print_table(
        "clorch.bench.ddp:worker",
        nproc=ns.nproc,
        backend="nccl" if cuda else "gloo",
        devices=list(range(ns.nproc)) if cuda else None,
        args=_argv_args(ns),
        timeout=1800,
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = parser()
    ns = p.parse_args(argv)
    _check(ns, p)
    if os.environ.get("RANK") is not None:
        return _under_launcher(ns)
    return _launch(ns)


if __name__ == "__main__":
    sys.exit(main())
