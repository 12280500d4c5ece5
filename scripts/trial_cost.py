"""A sweep trial's fixed cost on one GPU: `clorch-train` against a plain script, same steps.

    python scripts/trial_cost.py [--steps 200] [--runs 2] [--out DIR]

Both train GPT-2 small (12 layers, 768 wide, 1024 tokens, bf16 autocast, fused
AdamW, torch.compile) for the same steps on the same random token file, each in a
fresh process, alternating (clorch, plain, clorch, plain, ...); the first pair
compiles with a cold inductor cache, the later ones find it warm. For clorch the
process's time is split by summary.json: before launch (imports, composing, the
checks and the trial batch before launch), launch and the rest (ranks starting,
building the model, the final eval, the summary) and training (compile included).

With `--sweep N`, a sweep of N such trials (a grid over the seed, one at a time) follows the
pairs, its cache warm: each trial's time from its start to its end on the sweep's console,
against the warm plain script's (a sweep's trial of one rank trains in its own forked process:
clorch.engine.in_process).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PLAIN = r"""
import sys, time, numpy as np, torch
from clorch.models.gpt import GPT, GPTConfig
steps, path = int(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
data = torch.from_numpy(np.fromfile(path, dtype=np.uint16).astype(np.int64))
model = GPT(GPTConfig(vocab_size=50304, seq_len=1024, n_layer=12, n_head=12, d_model=768)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
step_fn = torch.compile(model)
start = time.perf_counter()
for step in range(steps):
    ix = torch.randint(len(data) - 1025, (16,))
    x = torch.stack([data[i:i + 1024] for i in ix]).cuda(non_blocking=True)
    y = torch.stack([data[i + 1:i + 1025] for i in ix]).cuda(non_blocking=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = step_fn(x)
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
print(time.perf_counter() - start)
"""


def _args(tokens: Path, steps: int) -> list[str]:
    return [
        "model=gpt", "model.n_layer=12", "model.n_head=12", "model.d_model=768", "model.vocab_size=50304",
        "data=tokens", f"data.train_path={tokens}", "data.seq_len=1024", "data.vocab_size=50304",
        "batch_size=16", "precision=bf16", "compile=true", f"max_steps={steps}", "epochs=100",
        "launcher.nproc_per_node=1", "log_every=50", "logger.progress=lines",
    ]  # fmt: skip


def _clorch(tokens: Path, steps: int, run_dir: Path) -> dict[str, float]:
    start = time.perf_counter()
    done = subprocess.run(
        ["clorch-train", *_args(tokens, steps), f"hydra.run.dir={run_dir}"], capture_output=True, text=True
    )
    total = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"clorch-train exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "total": total,
        "before launch": total - summary["wall_time_s"],
        "launch and rest": summary["wall_time_s"] - summary["train_time_s"],
        "training": summary["train_time_s"],
    }


def _plain(tokens: Path, steps: int) -> dict[str, float]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PLAIN, str(steps), str(tokens)], capture_output=True, text=True)
    total = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"the plain script exited {done.returncode}:\n{done.stderr[-3000:]}")
    return {"total": total, "training": float(done.stdout.strip().splitlines()[-1])}


def _sweep(tokens: Path, steps: int, trials: int, sweep_dir: Path) -> dict[str, float]:
    """A grid of `trials` seeds, one at a time: the sweep's wall time and each trial's, start to end."""
    seeds = ",".join(str(s) for s in range(1, trials + 1))
    command = ["clorch-train", "-m", *_args(tokens, steps), f"seed={seeds}", f"hydra.sweep.dir={sweep_dir}"]
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [(time.perf_counter() - start, line) for line in process.stdout]
    if process.wait() != 0:
        raise SystemExit(f"the sweep exited {process.returncode}:\n{''.join(t for _, t in lines)[-3000:]}")
    starts = [t for t, line in lines if line.startswith("clorch-train: trial ") and " started" in line]
    ends = [t for t, line in lines if line.startswith("clorch-train: succeeded")]
    each = [end - begin for begin, end in zip(starts, ends)]
    return {"total": time.perf_counter() - start, "trials": each, "first trial started": starts[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--runs", type=int, default=2, help="pairs; the first compiles with a cold cache")
    parser.add_argument("--out", type=Path, default=None, help="write trial_cost.json here")
    parser.add_argument("--sweep", type=int, default=0, help="then a sweep of this many trials, cache warm")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="clorch-trial-cost-"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(work / "inductor")  # cold for the first pair of this run
    tokens = work / "train.bin"
    np.random.default_rng(0).integers(0, 50257, 4_000_000, dtype=np.uint16).tofile(tokens)
    pairs = []
    for index in range(args.runs):
        pairs.append({"clorch": _clorch(tokens, args.steps, work / f"run{index}"), "plain": _plain(tokens, args.steps)})
        c, p = pairs[-1]["clorch"], pairs[-1]["plain"]
        print(
            f"pair {index} ({'cold' if index == 0 else 'warm'} cache): clorch-train {c['total']:.1f} s "
            f"(before launch {c['before launch']:.1f}, launch and rest {c['launch and rest']:.1f}, "
            f"training {c['training']:.1f}) | plain {p['total']:.1f} s (training {p['training']:.1f}) | "
            f"overhead {c['total'] - p['total']:+.1f} s",
            flush=True,
        )
    record: dict = {"pairs": pairs}
    if args.sweep:
        sweep = _sweep(tokens, args.steps, args.sweep, work / "sweep")
        plain = pairs[-1]["plain"]["total"]
        each = sorted(sweep["trials"])
        record["sweep"] = sweep
        median = each[len(each) // 2]
        times = ", ".join(f"{t:.1f}" for t in sweep["trials"])
        print(
            f"sweep of {args.sweep}: {sweep['total']:.1f} s, the first trial started at "
            f"{sweep['first trial started']:.1f} s; a trial, start to end: {times} s (median {median:.1f}) "
            f"| warm plain {plain:.1f} s | a trial's cost over it {median - plain:+.1f} s",
            flush=True,
        )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "trial_cost.json").write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
