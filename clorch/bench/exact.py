"""`clorch-bench exact`: what `exact=true` costs against the default, on the same run.

Each round runs the same `clorch-train` job twice, the default first and then
`exact=true` (the order alternates round by round), each a real run in a fresh
process: the same model, data, seed and world size. The step time is read from
the run's metrics.jsonl (the median of its logged windows' samples/s, the first
window left out: compilation and warm-up). Medians over rounds, and the ratio
exact / default (above 1: exact is slower).

    clorch-bench exact [--device cpu|cuda] [--nproc 1] [--preset tiny|gpt2-small]
                       [--compile] [--rounds 3] [--steps 60] [--json]

`--preset tiny` is a 2-layer GPT of width 64 on random tokens (CPU); `gpt2-small`
is GPT-2 small (124M) at 1024 tokens, bf16, on random tokens (GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from clorch.bench.stats import format_table, median, ratio

PRESETS = {
    "tiny": ["model.n_layer=2", "model.d_model=64", "model.n_head=4", "data.seq_len=64", "data.vocab_size=256"],
    "gpt2-small": [
        "model.n_layer=12",
        "model.d_model=768",
        "model.n_head=12",
        "data.seq_len=1024",
        "data.vocab_size=50304",
    ],
}


def _token_file(directory: Path, vocab: int, count: int) -> Path:
    """A headerless uint16 token file of random ids below `vocab` (the data is beside the point)."""
    import numpy as np  # lazy: kept out of clorch-bench's start, like torch

    path = directory / "train.bin"
    np.random.default_rng(0).integers(0, vocab, size=count, dtype=np.uint16).tofile(path)
    return path


def job(args: argparse.Namespace, tokens: Path) -> list[str]:
    """The benchmark's clorch-train overrides (without exact and the run directory)."""
    gpu = args.device == "cuda"
    return [
        "model=gpt",
        "data=tokens",
        f"data.train_path={tokens}",
        *PRESETS[args.preset],
        "model.dropout=0.1",
        "optim.grad_clip=1.0",
        f"backend={'nccl' if gpu else 'gloo'}",
        f"precision={'bf16' if gpu else 'fp32'}",
        f"launcher.nproc_per_node={args.nproc}",
        f"batch_size={args.batch_size}",
        f"max_steps={args.steps}",
        f"log_every={max(1, args.steps // 6)}",
        "eval_every=0",
        "logger.progress=off",
        "preflight=false",
        *(["compile=true"] if args.compile else []),
    ]


def _samples_per_s(run_dir: Path) -> float:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rates = [r["samples_per_s"] for r in records if r.get("kind") == "train"][1:]
    if not rates:
        raise RuntimeError(f"{run_dir}: too few logged windows; raise --steps")
    return median(rates)


def _run(overrides: list[str], run_dir: Path) -> float:
    command = [sys.executable, "-m", "clorch.cli", *overrides, f"hydra.run.dir={run_dir}"]
    done = subprocess.run(command, cwd=run_dir.parent, env=dict(os.environ), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"clorch-train exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return _samples_per_s(run_dir)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Interleaved rounds of the default and exact=true; their medians and the ratio of step times."""
    rates: dict[str, list[float]] = {"default": [], "exact": []}
    with tempfile.TemporaryDirectory(prefix="clorch-bench-exact-") as tmp:
        work = Path(tmp)
        vocab = int(PRESETS[args.preset][-1].split("=")[1])
        overrides = job(args, _token_file(work, vocab, 2_000_000))
        for round_ in range(args.rounds):
            order = ["default", "exact"] if round_ % 2 == 0 else ["exact", "default"]
            for name in order:
                flag = "exact=true" if name == "exact" else "exact=false"
                rates[name].append(_run([*overrides, flag], work / f"{name}-{round_}"))
    step = {name: args.batch_size * args.nproc / median(values) for name, values in rates.items()}
    return {
        "settings": vars(args),
        "samples_per_s": rates,
        "median_step_s": step,
        "exact_over_default": ratio(step["exact"], step["default"]),
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clorch-bench exact", description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--nproc", type=int, default=1, help="ranks (world size)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--batch-size", type=int, default=8, help="samples per rank per step")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    result = measure(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    step = result["median_step_s"]
    rows = [
        ["default", f"{step['default'] * 1e3:.2f}", f"{median(result['samples_per_s']['default']):,.0f}"],
        ["exact=true", f"{step['exact'] * 1e3:.2f}", f"{median(result['samples_per_s']['exact']):,.0f}"],
    ]
    print(format_table(["run", "median step ms", "median samples/s"], rows))
    print(f"exact / default step time: {result['exact_over_default']:.3f}x ({args.rounds} rounds, interleaved)")
    return 0
