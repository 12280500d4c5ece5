"""A sweep's fixed cost: an 8-trial sweep of 1-step trials against one fresh process training one step.

Each round runs, one after the other (the order alternating round by round):

- **plain**: a fresh `python -c "import torch; ..."` process that builds the trials' tiny
  model and trains it one step (what any trial must at least cost);
- **sweep**: `clorch-train -m` of `--trials` 1-step `cpu_smoke` trials, one at a time, a
  seeded random search over the learning rate.

The medians of their wall times and the ratio sweep / plain: what a sweep costs beyond the
one process every trial needs, as a multiple of it. The sweep's console says where its time
went: until its first trial started, the trials, and after the last one ended.

    clorch-bench sweep --only trials [--rounds 3] [--trials 8] [--device cuda]
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from clorch.bench.stats import median, ratio

PLAIN_STEP = (
    "import sys, torch\n"
    "device = torch.device(sys.argv[1])\n"
    "model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(device)\n"
    "opt = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
    "x, y = torch.randn(16, 8, device=device), torch.randn(16, 4, device=device)\n"
    "torch.nn.functional.mse_loss(model(x), y).backward(); opt.step()\n"
    "if device.type == 'cuda': torch.cuda.synchronize()\n"
)


def _timed_lines(command: list[str], cwd: Path) -> tuple[float, list[tuple[float, str]]]:
    """Run `command`; its wall time and each console line with the second it appeared."""
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [(time.perf_counter() - start, line.rstrip()) for line in process.stdout]
    if process.wait() != 0:
        raise RuntimeError(f"{' '.join(command)} exited {process.returncode}:\n" + "\n".join(t for _, t in lines))
    return time.perf_counter() - start, lines


def _sweep_command(sweep_dir: Path, trials: int, recipe: str, device: str) -> list[str]:
    on_gpu = ["backend=nccl"] if device == "cuda" else []
    return [
        sys.executable,
        "-m",
        "clorch.cli",
        "-m",
        f"+recipe={recipe}",
        "launcher.nproc_per_node=1",
        "max_steps=1",
        "hydra/sweeper=optuna",
        "optim.lr=tag(log, interval(1e-5, 3e-1))",
        f"hydra.sweeper.n_trials={trials}",
        "hydra/sweeper/sampler=random",
        "hydra.sweeper.sampler.seed=0",
        f"hydra.sweep.dir={sweep_dir}",
        *on_gpu,
    ]


def _phases(wall: float, lines: list[tuple[float, str]]) -> dict[str, float]:
    """Until the first trial started, from then until the last one ended, and after it."""
    starts = [t for t, line in lines if line.startswith("clorch-train: trial ") and " started" in line]
    ends = [t for t, line in lines if " succeeded" in line]  # a trial's own line, or the sweep's of it
    first, last = (starts[0], ends[-1]) if starts and ends else (0.0, wall)
    return {"before the first trial": first, "the trials": last - first, "after the last trial": wall - last}


def trial_cost(work: Path, rounds: int, trials: int, recipe: str = "cpu_smoke", device: str = "cpu") -> dict[str, Any]:
    """Interleaved rounds of the plain step and the sweep on `device` (cpu, or cuda: the trials
    over nccl on one GPU); their medians and ratio."""
    plain: list[float] = []
    sweeps: list[float] = []
    phases: list[dict[str, float]] = []
    for index in range(rounds):
        order = ("plain", "sweep") if index % 2 == 0 else ("sweep", "plain")
        for name in order:
            if name == "plain":
                plain.append(_timed_lines([sys.executable, "-c", PLAIN_STEP, device], work)[0])
            else:
                wall, lines = _timed_lines(_sweep_command(work / f"trials_{index}", trials, recipe, device), work)
                sweeps.append(wall)
                phases.append(_phases(wall, lines))
    medians = {key: median([p[key] for p in phases]) for key in phases[0]}
    one, many = median(plain), median(sweeps)
    per_trial = medians["the trials"] / trials
    return {"plain s": one, "sweep s": many, "ratio": ratio(many, one), "phases": medians, "trials": trials,
            "per trial s": per_trial, "device": device, "samples": {"plain": plain, "sweep": sweeps}}  # fmt: skip


def rows(result: dict[str, Any]) -> list[list[str]]:
    """The table rows `clorch-bench sweep` prints for this part."""
    phases = " / ".join(f"{v:.1f}" for v in result["phases"].values())
    trial, plain = result["per trial s"], result["plain s"]
    return [
        [f"{result['trials']} one-step trials / one fresh process",
         f"{result['sweep s']:.1f} s / {result['plain s']:.1f} s", f"{result['ratio']:.2f}x"],
        ["  before the first trial / the trials / after", f"{phases} s", ""],
        ["  one trial, started to ended / one fresh process", f"{trial:.2f} s / {plain:.2f} s",
         f"{trial - plain:+.2f} s"],
    ]  # fmt: skip
