"""`clorch-bench sweep`: what side-by-side trials and pruning buy a sweep, and a trial's fixed cost.

Four measurements, each on tiny 1-rank CPU trials of `+recipe=cpu_smoke` (or
`--recipe`), every sweep a real `clorch-train -m` process:

1. **Side by side**: the same seeded 8-trial Optuna sweep (random sampler: the
   same trials each time) with `n_jobs=1` and `n_jobs=2`, interleaved round by
   round; medians of the wall time and their ratio.
2. **Pruning**: the same seeded sweep with `pruner=median` against `pruner=none`:
   the steps its trials ran over the steps planned, and the wall times.
3. **ASHA** (`--only asha`): the same seeded sweep with `pruner=asha` (its defaults) against
   `pruner=none`, the same trials run to their end: the steps run over the steps planned
   (a paused trial's steps stop at its pause; a promoted one trains on from there), the
   best objective (ASHA's among the trials that finished) and the wall times.
4. **A trial's fixed cost**: one `clorch-train` run against a plain PyTorch script
   training the same model for the same steps in a fresh process, interleaved;
   the run's time split into before launch (imports, config checks, the trial batch
   before launch), launch and the rest (ranks starting, building, the final eval
   and summary) and training (summary.json's wall and train times).
5. **A sweep's fixed cost** (`--only trials`, clorch.bench.sweep_cost): an 8-trial sweep of 1-step trials against
   one fresh process training one step.
6. **Against Optuna in one process** (`--only anchor`, clorch.bench.sweep_anchor): the same search of a
   tiny Hugging Face GPT-2 (`--trials 10 --steps 120`), the whole sweep's wall time.

    clorch-bench sweep [--rounds 2] [--trials 8] [--steps 40] [--only side|prune|asha|cost|trials|anchor] [--json]
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
from typing import Any

from clorch.bench import sweep_anchor, sweep_cost
from clorch.bench.stats import format_table, median, ratio

PLAIN = r"""
import sys, time, torch
steps, batch = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(128, 8), torch.randn(128, 4)
start = time.perf_counter()
for step in range(steps):
    i = (step * batch) % 128
    loss = torch.nn.functional.mse_loss(model(x[i:i + batch]), y[i:i + batch])
    opt.zero_grad(); loss.backward(); opt.step()
print(time.perf_counter() - start)
"""


def _clorch_train(args: list[str], cwd: Path) -> float:
    """Run `clorch-train ARGS` in `cwd`; its wall time (raises if it did not exit 0)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "clorch.cli", *args], cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"clorch-train {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return elapsed


def _sweep_args(recipe: str, trials: int, steps: int, extra: list[str]) -> list[str]:
    return [
        "-m",
        f"+recipe={recipe}",
        "launcher.nproc_per_node=1",
        "epochs=1000",
        f"max_steps={steps}",
        f"eval_every={max(1, steps // 4)}",
        "hydra/sweeper=optuna",
        "optim.lr=tag(log, interval(1e-5, 3e-1))",
        f"hydra.sweeper.n_trials={trials}",
        "hydra/sweeper/sampler=random",
        "hydra.sweeper.sampler.seed=0",
        *extra,
    ]


def _steps_run(sweep_dir: Path) -> tuple[int, int]:
    """(steps the sweep's trials ran, steps they planned), from their summaries."""
    ran = planned = 0
    for summary in sweep_dir.glob("[0-9]*/summary.json"):
        record = json.loads(summary.read_text())
        ran += record.get("steps") or 0
        planned += record.get("planned_steps") or 0
    return ran, planned


def side_by_side(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    times: dict[str, list[float]] = {"n_jobs=1": [], "n_jobs=2": []}
    for index in range(args.rounds):
        order = ["n_jobs=1", "n_jobs=2"] if index % 2 == 0 else ["n_jobs=2", "n_jobs=1"]
        for name in order:
            extra = [f"hydra.sweeper.{name}", f"hydra.sweep.dir={work / f'jobs{name[-1]}_{index}'}"]
            times[name].append(_clorch_train(_sweep_args(args.recipe, args.trials, args.steps, extra), work))
    one, two = median(times["n_jobs=1"]), median(times["n_jobs=2"])
    return {"n_jobs=1 s": one, "n_jobs=2 s": two, "ratio": ratio(two, one), "samples": times}


def pruning(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pruner in ("none", "median"):
        sweep_dir = work / f"prune_{pruner}"
        extra = [f"hydra.sweeper.pruner={pruner}", "hydra.sweeper.min_trials=2", f"hydra.sweep.dir={sweep_dir}"]
        wall = _clorch_train(_sweep_args(args.recipe, args.trials, args.steps, extra), work)
        ran, planned = _steps_run(sweep_dir)
        out[pruner] = {"wall_s": wall, "steps_run": ran, "steps_planned": planned, "fraction": ratio(ran, planned)}
    return out


def _best_objective(sweep_dir: Path) -> float | None:
    """The lowest final eval_loss among the sweep's trials that succeeded (None: none did)."""
    values = [
        record["final"]["eval_loss"]
        for record in (json.loads(p.read_text()) for p in sweep_dir.glob("[0-9]*/summary.json"))
        if record.get("status") == "succeeded" and "eval_loss" in (record.get("final") or {})
    ]
    return min(values) if values else None


def asha(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pruner in ("none", "asha"):
        sweep_dir = work / f"asha_{pruner}"
        extra = [f"hydra.sweeper.pruner={pruner}", f"hydra.sweep.dir={sweep_dir}"]
        wall = _clorch_train(_sweep_args(args.recipe, args.trials, args.steps, extra), work)
        ran, planned = _steps_run(sweep_dir)
        out[pruner] = {
            "wall_s": wall,
            "steps_run": ran,
            "steps_planned": planned,
            "fraction": ratio(ran, planned),
            "best_eval_loss": _best_objective(sweep_dir),
            "finished": sum(
                json.loads(p.read_text()).get("status") == "succeeded" for p in sweep_dir.glob("[0-9]*/summary.json")
            ),
        }
    return out


def fixed_cost(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    rows: dict[str, list[float]] = {"clorch total": [], "before launch": [], "launch and rest": [], "training": []}
    rows.update({"plain total": [], "plain training": []})
    for index in range(args.rounds):
        run_dir = work / f"single_{index}"
        one = [f"+recipe={args.recipe}", "launcher.nproc_per_node=1", "epochs=1000", f"max_steps={args.steps}"]
        total = _clorch_train([*one, f"hydra.run.dir={run_dir}"], work)
        summary = json.loads((run_dir / "summary.json").read_text())
        rows["clorch total"].append(total)
        rows["before launch"].append(total - summary["wall_time_s"])
        rows["launch and rest"].append(summary["wall_time_s"] - summary["train_time_s"])
        rows["training"].append(summary["train_time_s"])
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", PLAIN, str(args.steps), "16"],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        rows["plain total"].append(time.perf_counter() - start)
        rows["plain training"].append(float(done.stdout.strip().splitlines()[-1]))
    medians = {k: median(v) for k, v in rows.items()}
    medians["overhead s"] = medians["clorch total"] - medians["plain total"]
    return medians


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="clorch-bench sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    parser.add_argument("--trials", type=int, default=8, help="trials per sweep (default 8)")
    parser.add_argument("--steps", type=int, default=40, help="planned steps per trial (default 40)")
    parser.add_argument("--recipe", default="cpu_smoke", help="the trials' recipe (default cpu_smoke)")
    parser.add_argument(
        "--only",
        choices=("side", "prune", "asha", "cost", "trials", "anchor"),
        action="append",
        help="run only these parts",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="trials' device (the trials part)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    parts = args.only or ["side", "prune", "cost", "trials"]  # asha when asked: two more sweeps
    results: dict[str, Any] = {"cores": len(os.sched_getaffinity(0))}
    with tempfile.TemporaryDirectory(prefix="clorch-bench-sweep-") as tmp:
        work = Path(tmp)
        if "side" in parts:
            results["side_by_side"] = side_by_side(work, args)
        if "prune" in parts:
            results["pruning"] = pruning(work, args)
        if "asha" in parts:
            results["asha"] = asha(work, args)
        if "cost" in parts:
            results["fixed_cost"] = fixed_cost(work, args)
        if "anchor" in parts:
            results["anchor"] = sweep_anchor.anchor(work, args.rounds, args.trials, args.steps)
        if "trials" in parts:
            results["trial_cost"] = sweep_cost.trial_cost(work, args.rounds, args.trials, args.recipe, args.device)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    _print(results, args)
    return 0


def _print(results: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"clorch-bench sweep: {args.trials} trials of {args.steps} steps, 1 CPU rank each, {results['cores']} cores")
    rows = _side_rows(results) + _prune_rows(results) + _asha_rows(results) + _cost_rows(results)
    rows += sweep_cost.rows(results["trial_cost"]) if "trial_cost" in results else []
    rows += sweep_anchor.rows(results["anchor"]) if "anchor" in results else []
    print(format_table(["measure", "value", "ratio"], rows))


def _side_rows(results: dict[str, Any]) -> list[list[str]]:
    if "side_by_side" not in results:
        return []
    side = results["side_by_side"]
    value = f"{side['n_jobs=2 s']:.1f} s / {side['n_jobs=1 s']:.1f} s"
    return [["sweep wall time, n_jobs=2 / n_jobs=1", value, f"{side['ratio']:.3f}x"]]


def _prune_rows(results: dict[str, Any]) -> list[list[str]]:
    if "pruning" not in results:
        return []
    pruned, whole = results["pruning"]["median"], results["pruning"]["none"]
    return [
        ["steps run / planned, pruner=median", f"{pruned['steps_run']} / {pruned['steps_planned']}",
         f"{pruned['fraction']:.3f}"],
        ["sweep wall time, median / none", f"{pruned['wall_s']:.1f} s / {whole['wall_s']:.1f} s",
         f"{ratio(pruned['wall_s'], whole['wall_s']):.3f}x"],
    ]  # fmt: skip


def _asha_rows(results: dict[str, Any]) -> list[list[str]]:
    if "asha" not in results:
        return []
    paused, whole = results["asha"]["asha"], results["asha"]["none"]
    best = lambda r: "none finished" if r["best_eval_loss"] is None else f"{r['best_eval_loss']:.4g}"  # noqa: E731
    return [
        ["steps run / planned, pruner=asha", f"{paused['steps_run']} / {paused['steps_planned']}",
         f"{paused['fraction']:.3f}"],
        ["best eval_loss, asha / none", f"{best(paused)} / {best(whole)}",
         f"{paused['finished']} / {whole['finished']} finished"],
        ["sweep wall time, asha / none", f"{paused['wall_s']:.1f} s / {whole['wall_s']:.1f} s",
         f"{ratio(paused['wall_s'], whole['wall_s']):.3f}x"],
    ]  # fmt: skip


def _cost_rows(results: dict[str, Any]) -> list[list[str]]:
    if "fixed_cost" not in results:
        return []
    c = results["fixed_cost"]
    parts = f"{c['before launch']:.1f} / {c['launch and rest']:.1f} / {c['training']:.1f} s"
    return [
        ["one trial: clorch-train / plain script", f"{c['clorch total']:.1f} s / {c['plain total']:.1f} s",
         f"+{c['overhead s']:.1f} s"],
        ["  before launch / launch and rest / training", parts, ""],
    ]  # fmt: skip
