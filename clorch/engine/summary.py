"""A run's records in its directory: config.yaml and env.json when it starts, summary.json
and loss.png when it ends (written by the launching process, or by rank 0 of an outside
launcher's job), and the one-line error the console shows.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Mapping

import yaml

from clorch._files import write_text_atomic
from clorch.config.plan import Plan
from clorch.engine.outputs import env_record, plot_loss, read_metrics, write_json


def describe_error(error: Mapping[str, Any], failed: str = "failed") -> str:
    """`rank R failed: Type: message` (or what is known of it), for one line of the console."""
    rank = error.get("rank")
    who = f"rank {rank} {failed}: " if rank is not None else ""
    what = ": ".join(str(x) for x in (error.get("type"), error.get("message")) if x) or "no error recorded"
    return who + what


def _best(records: list[dict[str, Any]]) -> dict[str, Any]:
    evals = [r for r in records if r.get("kind") == "eval"]
    if not evals:
        return {}
    best = min(evals, key=lambda r: r["eval_loss"])
    return {k: v for k, v in best.items() if k != "kind"}


def summarize(status: Mapping[str, Any], run_dir: Path, plan: Plan, wall_s: float) -> dict[str, Any]:
    """summary.json's content: status, final and best metrics, steps, wall time, throughput."""
    records = read_metrics(run_dir / "metrics.jsonl")
    train = [r for r in records if r.get("kind") == "train"]
    results = status.get("results") or []
    rank0 = (results[0] if isinstance(results, list) and results else None) or {}
    final = {k: v for k, v in (train[-1] if train else {}).items() if k != "kind"}
    final.update({f"eval_{k}": v for k, v in (rank0.get("final_eval") or {}).items()})
    summary = {
        "status": status.get("state"), "exit_codes": status.get("exit_codes"),
        "failed_rank": status.get("failed_rank"), "error": status.get("error"),
        "steps": rank0.get("steps", final.get("step", 0)), "planned_steps": plan.total_steps,
        "final": final, "best": _best(records), "wall_time_s": wall_s,
        "train_time_s": rank0.get("train_time_s"), "samples_per_s": rank0.get("samples_per_s"),
        "tokens_per_s": rank0.get("tokens_per_s"), "weights_sha256": rank0.get("weights_sha256"),
        "resumed_from": rank0.get("resumed_from"), "world_size": plan.world_size,
        "backend": plan.backend, "attempts": len(status.get("attempts") or []) or 1,
        "trusted_modules": plan.trusted_modules, "exported": rank0.get("exported"),
    }
    if status.get("interrupted_by"):
        summary["interrupted_by"] = status["interrupted_by"]
    if rank0.get("preflight"):  # the machines' check ran first (preflight=true or only)
        summary["preflight"] = rank0["preflight"]
        if summary["status"] == "succeeded" and not rank0["preflight"]["passed"]:
            summary["status"] = "preflight_failed"
    return summary


def trusted_comment(trusted: Mapping[str, list[str]]) -> str:
    """YAML comment lines naming the modules trusted for `_target_` (empty when none were)."""
    return "".join(f"# trusted modules ({where}): {', '.join(names)}\n" for where, names in trusted.items())


def write_summary(run_dir: Path, summary: Mapping[str, Any], plot: bool = True) -> bool:
    """Write summary.json (and loss.png, with `plot`) into `run_dir`; return whether it could.

    When it cannot (the directory was removed or made read-only while the run lived), it
    says so on stderr instead of ending the run's report with a traceback.
    """
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json(run_dir / "summary.json", summary)
    except OSError as exc:
        print(f"clorch-train: no summary.json: cannot write it in {run_dir} ({exc.strerror or exc}); "
              f"the run ended {summary.get('status')}", file=sys.stderr, flush=True)
        return False
    if plot:
        plot_loss(run_dir)
    return True


def write_start(plan: Plan, run_dir: Path, **extra: Any) -> None:
    """Create `run_dir` and write config.yaml (the checked config) and env.json (machine, plan, `extra`)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    # Atomic: under launcher=torchrun every node writes it, while other nodes' ranks may read it.
    write_text_atomic(run_dir / "config.yaml", trusted_comment(plan.trusted_modules)
                      + yaml.safe_dump(plan.config.to_dict(), sort_keys=False))
    shown = {k: v for k, v in plan.to_dict().items() if k != "config"}
    write_json(run_dir / "env.json", {**env_record(), **extra, "plan": shown})
