"""A clorch sweep against Optuna in one process, on the same workload: the whole sweep's wall time.

The workload: a Hugging Face GPT-2 built from a `GPT2Config` (2 layers, 4 heads, 64 wide, byte
tokens, 64-token windows), `--trials` trials of `--steps` steps of 16 windows, AdamW, the
learning rate searched on a log scale by TPE with seed 0, each trial scored by its loss on the
same held-out windows at its end. The tokens are the bytes of clorch's own source files.

- **optuna**: one fresh process imports torch, transformers and Optuna and runs
  `study.optimize` over a plain training loop: the least a search can cost;
- **clorch**: `clorch-train -m` of the same model (examples/hf_causal_lm's recipe, by config
  alone), one rank, one trial at a time, each trial a run of its own.

Rounds alternate their order; the medians of the wall times and their ratio clorch / optuna.
Needs `pip install transformers`.

    clorch-bench sweep --only anchor [--rounds 2] [--trials 10] [--steps 120]
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import clorch
from clorch.bench.stats import median, ratio

SEQ, BATCH, EVAL_WINDOWS = 64, 16, 64

RECIPE = f"""# @package _global_
defaults:
  - override /backend: gloo
  - override /precision: fp32
  - override /data: tokens
  - override /loss: from_model
model:
  _target_: transformers.GPT2LMHeadModel
  config:
    _target_: transformers.GPT2Config
    vocab_size: 256
    n_positions: {SEQ}
    n_layer: 2
    n_head: 4
    n_embd: 64
    resid_pdrop: 0.0
    embd_pdrop: 0.0
    attn_pdrop: 0.0
    bos_token_id: null
    eos_token_id: null
loss:
  target_arg: labels
  labels: input
data:
  seq_len: {SEQ}
  vocab_size: 256
batch_size: {BATCH}
epochs: 1000
launcher:
  nproc_per_node: 1
"""

OPTUNA = rf"""
import sys, numpy as np, optuna, torch, transformers
train_path, eval_path, trials, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def windows(path):
    ids = torch.from_numpy(np.fromfile(path, dtype=np.uint16).astype(np.int64))
    return ids[: len(ids) // {SEQ} * {SEQ}].view(-1, {SEQ})
train, held_out = windows(train_path), windows(eval_path)
def objective(trial):
    lr = trial.suggest_float("optim.lr", 1e-4, 1e-1, log=True)
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=256, n_positions={SEQ}, n_layer=2, n_head=4, n_embd=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None)
    model = transformers.GPT2LMHeadModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    order = torch.randperm(len(train))
    for step in range(steps):
        batch = train[order[(step * {BATCH}) % len(train):][:{BATCH}]]
        loss = model(batch, labels=batch).loss
        opt.zero_grad(); loss.backward(); opt.step()
    model.eval()
    with torch.no_grad():
        losses = [model(held_out[i:i + {BATCH}], labels=held_out[i:i + {BATCH}]).loss.item()
                  for i in range(0, len(held_out), {BATCH})]
    return sum(losses) / len(losses)
optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0))
study.optimize(objective, n_trials=trials)
print(study.best_value)
"""


def _tokens(work: Path) -> tuple[Path, Path]:
    """train.bin and eval.bin: the bytes of clorch's source files, as uint16 token ids."""
    text = b"".join(p.read_bytes() for p in sorted(Path(clorch.__file__).parent.rglob("*.py")))
    ids = np.frombuffer(text, dtype=np.uint8).astype(np.uint16)
    held_out = EVAL_WINDOWS * SEQ
    train, evaluate = work / "train.bin", work / "eval.bin"
    ids[:-held_out].tofile(train)
    ids[-held_out:].tofile(evaluate)
    return train, evaluate


def _run(command: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])} ... exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr}")
    return time.perf_counter() - start, done.stdout


def _clorch(work: Path, index: int, paths: tuple[Path, Path], trials: int, steps: int) -> list[str]:
    recipe = work / "tiny_gpt2.yaml"
    recipe.write_text(RECIPE)
    return [
        sys.executable, "-m", "clorch.cli", "-m", f"+recipe={recipe}",
        f"data.train_path={paths[0]}", f"data.eval_path={paths[1]}", f"max_steps={steps}",
        "hydra/sweeper=optuna", "optim.lr=tag(log, interval(1e-4, 1e-1))", f"hydra.sweeper.n_trials={trials}",
        "hydra.sweeper.sampler.seed=0", f"hydra.sweep.dir={work / f'clorch_{index}'}",
    ]  # fmt: skip


def anchor(work: Path, rounds: int, trials: int, steps: int) -> dict[str, Any]:
    """Interleaved rounds of Optuna in one process and the clorch sweep; medians and ratio."""
    paths = _tokens(work)
    env = {**os.environ, "CLORCH_TRUSTED_MODULES": "transformers"}
    walls: dict[str, list[float]] = {"optuna": [], "clorch": []}
    best: dict[str, float] = {}
    for index in range(rounds):
        for name in ("optuna", "clorch") if index % 2 == 0 else ("clorch", "optuna"):
            if name == "optuna":
                command = [sys.executable, "-c", OPTUNA, str(paths[0]), str(paths[1]), str(trials), str(steps)]
                wall, out = _run(command, env)
                best[name] = float(out.strip().splitlines()[-1])
            else:
                wall, out = _run(_clorch(work, index, paths, trials, steps), env)
                found = re.search(r"best trial \d+: eval_loss ([-+.e\d]+)", out)
                best[name] = float(found.group(1)) if found else float("nan")
            walls[name].append(wall)
    one, many = median(walls["optuna"]), median(walls["clorch"])
    return {"optuna s": one, "clorch s": many, "ratio": ratio(many, one), "best": best, "samples": walls,
            "trials": trials, "steps": steps}  # fmt: skip


def rows(result: dict[str, Any]) -> list[list[str]]:
    """The table rows `clorch-bench sweep` prints for this part."""
    best = result["best"]
    losses = f"{best.get('clorch', float('nan')):.4g} / {best.get('optuna', float('nan')):.4g}"
    return [
        [f"{result['trials']} trials of {result['steps']} steps, HF GPT-2: clorch / Optuna in one process",
         f"{result['clorch s']:.1f} s / {result['optuna s']:.1f} s", f"{result['ratio']:.2f}x"],
        ["  best held-out loss, clorch / Optuna", losses, ""],
    ]  # fmt: skip
