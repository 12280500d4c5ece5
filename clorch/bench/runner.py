"""`clorch-bench runner`: clorch's training loop against a hand-written PyTorch loop.

Same model (GPT-2 small by default: 12 layers, d_model 768, 12 heads, sequence
1024, vocabulary 50304, ~124M parameters), same data (random tokens, or with
`--tokens markov` a learnable chain: one fixed tensor, or with `--data dataset` a
token file read through a map-style Dataset), bf16
autocast, fused AdamW, batch 16 x 1024 tokens a step.

* plain: `autocast -> forward -> cross_entropy -> backward -> optimizer.step -> zero_grad`;
  with `--nproc` above 1 the model is wrapped in torch's DistributedDataParallel, as a
  torch DDP script does.
* clorch: `clorch.train.loop.fit` with clorch's DDP (nccl, or gloo on CPU),
  DistributedSampler, clorch.amp.autocast and the engine's metrics hooks
  (metrics.jsonl every `--log-every` steps).

`--nproc N` runs both loops on N ranks (one GPU each, or N CPU processes); tokens/s
counts every rank's tokens, and the timings are rank 0's (the gradient all-reduce keeps
the ranks in step).

Blocks of `--steps` steps alternate between the two (A B, B A, ...) after a
warm-up; reported: median tokens/s, the ratio clorch/plain (goal >= 0.98) and
MFU against the bf16 dense peak (`--peak-tflops`, 989 for an H100/H200 SXM), with the GPU's
SM clock, power and temperature during the timed blocks (`clorch.bench.gpuclock`): a busy
H200 reaches its power limit and lowers its clock, and MFU falls with it.
`--compile` applies torch.compile to both models; clorch's side also compiles
its loss, as the engine does with `compile: true`. Needs a CUDA GPU unless
`--device cpu` (with a tiny `--preset`, for a smoke run).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import clorch.distributed as cd
from clorch.amp import MixedPrecision
from clorch.bench import runner_dataset
from clorch.bench.runner_tokens import RandomTokens, bench_tasks, held_out_lines
from clorch.bench import runner_variants as variants
from clorch.bench.gpuclock import GpuMonitor, describe
from clorch.bench.stats import format_table, median
from clorch.config.schema import COMPILE_MODES, TrainConfig
from clorch.data import DistributedSampler
from clorch.data.placement import place_task
from clorch.train.components import Components, compile_mode_arg, replays_cuda_graphs
from clorch.train.loop import LoopState, fit
from clorch.train.metrics import MetricsWriter
from clorch.train.worker import StepHooks
from clorch.models import GPT, GPTConfig
from clorch.nn.parallel import DistributedDataParallel
from clorch.optim import build_optimizer, build_scheduler

PRESETS = {
    "gpt2-small": dict(vocab_size=50304, seq_len=1024, n_layer=12, n_head=12, d_model=768),
    "gpt-1b": dict(vocab_size=50304, seq_len=1024, n_layer=18, n_head=16, d_model=2048),  # about 1.0B parameters
    # about 1.0B parameters too, in fewer, wider layers: larger matrix products (float8 gains more on them)
    "gpt-1b-wide": dict(vocab_size=50304, seq_len=1024, n_layer=8, n_head=24, d_model=3072),
    "tiny": dict(vocab_size=512, seq_len=64, n_layer=2, n_head=2, d_model=64),
    "llama-tiny": dict(vocab_size=32000, seq_len=1024),  # a Hugging Face Llama (runner_variants): --variants hf,liger
}


# The command line, one row per flag: (flag, argparse keywords, help).
_FLAGS = (
    ("--preset", dict(choices=sorted(PRESETS), default="gpt2-small"), None),
    ("--batch-size", dict(type=int, default=16), "sequences per step"),
    ("--steps", dict(type=int, default=10), "steps per timed block"),
    ("--rounds", dict(type=int, default=5), "alternating blocks per loop"),
    ("--warmup", dict(type=int, default=5), "untimed steps per loop first"),
    ("--log-every", dict(type=int, default=10), "clorch metrics line every N steps"),
    ("--compile", dict(action="store_true"), "torch.compile both models"),
    (
        "--compile-mode",
        dict(choices=COMPILE_MODES, default="default"),
        "torch.compile mode for both loops (the engine's compile_mode)",
    ),
    ("--device", dict(choices=("cuda", "cpu"), default="cuda"), None),
    (
        "--data",
        dict(choices=("tensor", "dataset"), default="tensor"),
        "tensor: one fixed token tensor; dataset: the same tokens in a token file (uint16, "
        "as nanoGPT writes one), read by a map-style torch Dataset through a DataLoader on "
        "both sides (data._target_'s path)",
    ),
    ("--num-workers", dict(type=int, default=0), "--data dataset: DataLoader workers"),
    (
        "--tokens",
        dict(choices=("random", "markov"), default="random"),
        "random: uniform tokens ('loss after': on training samples); markov: walks of a fixed "
        "Markov chain, learnable ('loss after': on held-out walks), to compare what loops learn",
    ),
    (
        "--nproc",
        dict(type=int, default=1),
        "ranks (GPUs, or CPU processes with --device cpu); the plain loop uses torch DDP",
    ),
    (
        "--gpu-sample-ms",
        dict(type=int, default=200),
        "sample the GPU's clock and power with nvidia-smi every N ms (0: off)",
    ),
    ("--peak-tflops", dict(type=float, default=989.0), "bf16 dense peak for MFU"),
    (
        "--variants",
        dict(type=lambda text: [v for v in text.split(",") if v], default=[]),
        "more clorch loops in the same rounds (runner_variants): fused, fp8, fp8-fused; hf, liger "
        "with --preset llama-tiny",
    ),
    ("--chunk-size", dict(type=int, default=4096), "fused variants: tokens per chunk (loss.chunk_size)"),
    ("--fp8-recipe", dict(choices=("tensorwise", "rowwise"), default="tensorwise"), None),
    ("--fp8-min-features", dict(type=int, default=1024), "fp8 variants: precision.min_features"),
    ("--no-plain", dict(action="store_true"), "leave out the plain loop (memory for large models)"),
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="clorch-bench runner", description=__doc__.splitlines()[0])
    for flag, options, text in _FLAGS:
        p.add_argument(flag, **options, help=text)
    return p


def _torch_ddp(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """The plain side's model as a torch DDP script wraps it (unwrapped on one rank)."""
    if cd.world_size() == 1:
        return model
    return TorchDDP(model, device_ids=[device.index] if device.type == "cuda" else None)


def _models(opts: dict, device: torch.device):
    config = GPTConfig(**PRESETS[opts["preset"]])
    torch.manual_seed(0)
    plain = GPT(config).to(device)
    torch.manual_seed(0)
    theirs = GPT(config).to(device)
    return config, plain, theirs


def _plain_runner(model, task: RandomTokens, opts: dict, device: torch.device):
    compiled = torch.compile(model, mode=compile_mode_arg(opts["compile_mode"])) if opts["compile"] else model
    optimizer = build_optimizer("adamw", model.parameters(), lr=3e-4, weight_decay=0.1)
    gen = torch.Generator().manual_seed(1 + cd.rank())  # each rank its own draws
    state = {"step": 0}

    def run(steps: int) -> None:
        for _ in range(steps):
            idx = torch.randint(0, len(task), (opts["batch_size"],), generator=gen)
            batch = {
                k: v.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else v
                for k, v in task.batch(idx).items()
            }
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = task.loss(compiled, batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            state["step"] += 1

    return run


def _clorch_runner(model, task: RandomTokens, opts: dict, device: torch.device, run_dir: Path, wrap=None):
    task = copy.copy(task)  # the plain loop keeps the host copy; the engine places its own
    place_task(task, device)
    task.compile_loss = opts["compile"] and opts["compile_mode"]  # as the engine does with compile: true
    task = wrap(task) if wrap is not None else task  # a variant's loss (runner_variants.variant_task)
    run_dir.mkdir(parents=True, exist_ok=True)
    inner = torch.compile(model, mode=compile_mode_arg(opts["compile_mode"])) if opts["compile"] else model
    ddp = DistributedDataParallel(inner)
    optimizer = build_optimizer("adamw", model.parameters(), lr=3e-4, weight_decay=0.1)
    parts = Components(
        model=ddp,
        raw_model=model,
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, "constant"),
        task=task,
        eval_task=task,
        sampler=DistributedSampler(len(task), seed=1),
        device=device,
        precision=MixedPrecision("bf16", device),
        batch_size=opts["batch_size"],
        accumulation=1,
        cuda_graphs=replays_cuda_graphs(opts["compile"], opts["compile_mode"], device),
    )
    cfg = TrainConfig(log_every=opts["log_every"], eval_every=0)  # no checkpoints
    writer = MetricsWriter(run_dir / "metrics.jsonl")
    hooks = StepHooks(cfg, parts, run_dir, opts["warmup"] + opts["rounds"] * opts["steps"], writer)
    state = LoopState()

    def run(steps: int) -> None:
        fit(parts, state.step + steps, state, hooks)

    return run, writer


def _time_block(run, steps: int, device: torch.device) -> tuple[float, float]:
    """(seconds, peak bytes allocated during the block; 0 on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    run(steps)
    if device.type == "cuda":
        torch.cuda.synchronize()
        return time.perf_counter() - start, float(torch.cuda.max_memory_allocated(device))
    return time.perf_counter() - start, 0.0


def _build_runners(opts: dict, device: torch.device, task: RandomTokens, tmp: Path):
    """{loop name: run(steps)}, {loop name: its raw model}, clorch's metrics writer and task."""
    runners, models, writers = {}, {}, []
    if opts["preset"] in variants.HF_PRESETS:
        config = None
    else:
        config, plain_model, clorch_model = _models(opts, device)
        if opts["data"] == "dataset":
            dataset = runner_dataset.TokenWindows.written(task.data, tmp / f"tokens-{cd.rank()}.bin")
            if not opts["no_plain"]:
                runners["plain"] = runner_dataset.plain_runner(_torch_ddp(plain_model, device), dataset, opts, device)
            task = runner_dataset.clorch_task(dataset, opts, device)
        elif not opts["no_plain"]:
            runners["plain"] = _plain_runner(_torch_ddp(plain_model, device), task, opts, device)
        if "plain" in runners:
            models["plain"] = plain_model
        runners["clorch"], writer = _clorch_runner(clorch_model, task, opts, device, tmp / "clorch")
        models["clorch"] = clorch_model
        writers.append(writer)
    for name in opts["variants"]:
        model = variants.variant_model(name, config, opts, device)
        wrap = variants.OwnLossTask if variants.own_loss(name) else None
        runners[f"clorch+{name}"], writer = _clorch_runner(model, task, opts, device, tmp / name, wrap=wrap)
        models[f"clorch+{name}"] = model
        writers.append(writer)
    return runners, models, writers, tmp / ("clorch" if config is not None else opts["variants"][0])


def _interleaved(runners: dict, opts: dict, device: torch.device, tokens_per_step: int, held_out_loss=None):
    """Alternating timed blocks (A B, B A, ...): tokens/s of each block, each loop's peak memory and,
    with `held_out_loss(name)`, each loop's held-out loss after each of its blocks (untimed)."""
    samples_s: dict[str, list[float]] = {name: [] for name in runners}
    peaks: dict[str, float] = {name: 0.0 for name in runners}
    curves: dict[str, list[float]] = {name: [] for name in runners}
    for r in range(opts["rounds"]):
        order = list(runners) if r % 2 == 0 else list(reversed(runners))
        for name in order:
            seconds, peak = _time_block(runners[name], opts["steps"], device)
            samples_s[name].append(tokens_per_step * opts["steps"] / seconds)
            peaks[name] = max(peaks[name], peak)
            if held_out_loss is not None:
                curves[name].append(held_out_loss(name))
    return samples_s, peaks, curves


def worker(ctx: dict) -> dict:
    """Run every loop interleaved on this rank's device and return the results (every rank calls it)."""
    opts = ctx["args"]
    device = cd.device() if opts["device"] == "cuda" else torch.device("cpu")
    preset = PRESETS[opts["preset"]]
    opts = {**opts, "seq_len": preset["seq_len"]}
    samples = opts["batch_size"] * cd.world_size() * (opts["warmup"] + opts["rounds"] * opts["steps"])
    task, held_out = bench_tasks(opts["tokens"], opts["batch_size"], samples, preset["seq_len"], preset["vocab_size"])
    tokens_per_step = opts["batch_size"] * preset["seq_len"] * cd.world_size()
    with tempfile.TemporaryDirectory(prefix="clorch-bench-runner-") as tmp:
        runners, models, writers, metrics_dir = _build_runners(opts, device, task, Path(tmp))
        for run in runners.values():
            _time_block(run, opts["warmup"], device)
        # on the Markov chain one reading can fall anywhere on a loop's way off its first plateau:
        # the held-out loss after every block gives each loop's curve
        track = None
        if opts["tokens"] == "markov":
            track = lambda name: variants.fixed_batch_loss(models[name], held_out, device)  # noqa: E731
        with GpuMonitor(device, interval_ms=opts["gpu_sample_ms"]) as monitor:
            samples_s, peaks, curves = _interleaved(runners, opts, device, tokens_per_step, track)
        for writer in writers:
            writer.close()
        metrics_lines = sum(1 for _ in open(metrics_dir / "metrics.jsonl"))
    first = next(iter(models.values()))
    flops = first.flops_per_token()
    tps = {name: median(v) for name, v in samples_s.items()}
    peak = opts["peak_tflops"] * 1e12 * cd.world_size()
    return {
        "tokens_per_s": tps,
        "samples": samples_s,
        "ratio": tps["clorch"] / tps["plain"] if "plain" in tps and "clorch" in tps else None,
        "mfu": {n: t * flops / peak for n, t in tps.items()},
        "peak_memory": peaks,
        "fixed_batch_loss": {n: variants.fixed_batch_loss(m, held_out, device) for n, m in models.items()},
        "held_out_curves": curves,
        "world_size": cd.world_size(),
        "params": first.num_parameters(),
        "metrics_lines": metrics_lines,
        "gpu": monitor.summary(),
        "gpu_problem": monitor.problem,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
    }


def report(result: dict, opts: dict) -> str:
    rows = [
        [
            name,
            result["tokens_per_s"][name],
            f"{100 * result['mfu'][name]:.1f}%",
            variants.memory_row(result["peak_memory"], name),
            f"{result['fixed_batch_loss'][name]:.4f}",
        ]
        for name in result["tokens_per_s"]
    ]
    extra = ""
    if opts["variants"]:
        extra = (
            f", variants {','.join(opts['variants'])} (chunk {opts['chunk_size']} tokens, fp8 "
            f"{opts['fp8_recipe']} from {opts['fp8_min_features']} features)"
        )
    head = (
        f"runner: {opts['preset']} ({result['params'] / 1e6:.1f}M params), batch "
        f"{opts['batch_size']}, bf16 autocast, fused AdamW, compile={opts['compile']} "
        f"({opts['compile_mode']}), "
        f"data={opts['data']}{' (%d workers)' % opts['num_workers'] if opts['data'] == 'dataset' else ''}"
        f"{', markov-chain tokens' if opts['tokens'] == 'markov' else ''}"
        f"{extra}, "
        f"{result['device']} x {result['world_size']}; median of {opts['rounds']} blocks x {opts['steps']} steps"
    )
    table = format_table(["loop", "tokens/s", "MFU", "peak GiB", "loss after"], rows)
    text = f"{head}\n{table}\n"
    if result["ratio"] is not None:
        text += f"ratio clorch/plain tokens/s: {result['ratio']:.4f}\n"
    for name in result["tokens_per_s"]:
        if name.startswith("clorch+") and "clorch" in result["tokens_per_s"]:
            text += (
                f"ratio {name}/clorch tokens/s: {result['tokens_per_s'][name] / result['tokens_per_s']['clorch']:.4f}\n"
            )
    text += held_out_lines(result.get("held_out_curves", {}), opts["warmup"], opts["steps"])
    if result["device"] != "cpu" and opts["gpu_sample_ms"]:  # MFU follows the clock
        text += describe(result["gpu"], result["gpu_problem"]) + "\n"
    return text


def _check(opts: dict, p: argparse.ArgumentParser) -> None:
    """Every bad argument at once, before anything starts (argparse's exit code 2)."""
    errors = [
        f"--{name.replace('_', '-')} must be >= {low}, got {opts[name]}"
        for name, low in (
            ("batch_size", 1),
            ("steps", 1),
            ("rounds", 1),
            ("warmup", 0),
            ("log_every", 1),
            ("gpu_sample_ms", 0),
            ("num_workers", 0),
            ("nproc", 1),
        )
        if opts[name] < low
    ]
    if not opts["peak_tflops"] > 0:
        errors.append(f"--peak-tflops must be > 0, got {opts['peak_tflops']}")
    errors += variants.check_variants(opts)
    if opts["device"] == "cuda" and not torch.cuda.is_available():
        errors.append("--device cuda: no CUDA device here (HINT: --device cpu --preset tiny for a smoke run)")
    elif opts["device"] == "cuda" and opts["nproc"] > torch.cuda.device_count():
        errors.append(f"--nproc {opts['nproc']}: only {torch.cuda.device_count()} CUDA device(s) here")
    if errors:
        p.error("; ".join(errors))


def main(argv: list[str] | None = None) -> int:
    p = parser()
    opts = vars(p.parse_args(sys.argv[1:] if argv is None else argv))
    _check(opts, p)
    if "RANK" in os.environ:
        with cd.process_group(backend="nccl" if opts["device"] == "cuda" else "gloo"):
            print(report(worker({"args": opts}), opts))
        return 0
    backend = "nccl" if opts["device"] == "cuda" else "gloo"
    job = cd.launch(
        "clorch.bench.runner:worker",
        nproc_per_node=opts["nproc"],
        backend=backend,
        args=opts,
        devices=list(range(opts["nproc"])) if backend == "nccl" else None,
    )
    status = job.wait()
    if status["state"] != "succeeded":
        print(f"benchmark failed: {status}\n{cd.job_logs(job, 0)['stderr']}", file=sys.stderr)
        return 1
    print(report(status["results"][0], opts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
