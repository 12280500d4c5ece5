"""What `clorch-runs show` and `clorch-runs diff` print: plain data first, then text."""

from __future__ import annotations

from typing import Any

import yaml

from clorch.runs.commands import checkpoint_dir, checkpoints, rerun_command, resume_command
from clorch.runs.query import flatten
from clorch.runs.records import Run
from clorch.runs.table import cell, format_table, shown_path

_ENV_KEYS = ("python", "torch", "cuda", "cuda_available", "nccl", "gpus", "host", "platform", "cwd", "command")


def show_data(run: Run) -> dict[str, Any]:
    """Everything `show` prints, as plain JSON values."""
    job_status = run.job.get("status") if isinstance(run.job.get("status"), dict) else {}
    error = run.summary.get("error") or job_status.get("error")
    return {
        **run.record(),
        "error": error,
        "failed_rank": run.summary.get("failed_rank"),
        "interrupted_by": run.summary.get("interrupted_by"),
        "resumed_from": run.summary.get("resumed_from"),
        "throughput": {
            k: run.summary.get(k) for k in ("samples_per_s", "tokens_per_s") if run.summary.get(k) is not None
        },
        "checkpoint_dir": str(checkpoint_dir(run)),
        "checkpoints": checkpoints(run),
        "commands": {"rerun": rerun_command(run), "resume": resume_command(run)},
        "env": run.env,
        "config": run.config,
    }


def show_text(run: Run) -> str:
    data = show_data(run)
    lines = [f"run        {data['id']}  {shown_path(run.path)}", f"status     {data['status']}" + _progress(data)]
    if data["error"]:
        error = data["error"] if isinstance(data["error"], dict) else {"message": data["error"]}
        who = f"rank {error.get('rank')}: " if error.get("rank") is not None else ""
        lines.append(f"error      {who}{': '.join(str(error[k]) for k in ('type', 'message') if error.get(k))}")
    lines += [
        f"{k:<10} {v}"
        for k, v in (
            ("started", data["start"] or "unknown"),
            ("recipe", data["recipe"] or "-"),
            ("overrides", " ".join(data["overrides"]) or "-"),
            ("commit", data["commit"] or f"- (clorch {data['clorch_commit'] or 'unknown'})"),
            ("resumed", data["resumed_from"]),
        )
        if k != "resumed" or v
    ]
    lines += [f"problem    {p}" for p in data["problems"]]
    lines += ["", "metrics", _metrics_table(data)]
    listed = [
        f"  step {c['step']}: {c['path']}" if c["step"] is not None else f"  {c['path']}" for c in data["checkpoints"]
    ]
    policy = (
        (run.config.get("checkpoint") or {}).get("policy") if isinstance(run.config.get("checkpoint"), dict) else None
    )
    lines += ["", f"checkpoints (policy {policy or 'unknown'}, {data['checkpoint_dir']})", *(listed or ["  none"])]
    env = run.env
    lines += [
        "",
        "environment",
        *(f"  {k}: {cell(env[k]) if k != 'command' else ' '.join(map(str, env[k]))}" for k in _ENV_KEYS if k in env),
    ]
    lines += ["", "commands", f"  re-run: {data['commands']['rerun']}", f"  resume: {data['commands']['resume']}"]
    config = yaml.safe_dump(data["config"], sort_keys=False).rstrip() if data["config"] else "(no config.yaml)"
    lines += ["", "config", *("  " + line for line in config.splitlines())]
    return "\n".join(lines)


def _progress(data: dict[str, Any]) -> str:
    parts = []
    if data["steps"] is not None:
        parts.append(f"{data['steps']}/{data['planned_steps'] or '?'} steps")
    if data["wall_time_s"] is not None:
        parts.append(f"{data['wall_time_s']:.1f} s")
    if data["world_size"] is not None:
        parts.append(f"world size {data['world_size']}")
    parts += [f"{k} {v:.4g}" for k, v in data["throughput"].items() if isinstance(v, (int, float))]
    if data["interrupted_by"]:
        parts.append(f"interrupted by {data['interrupted_by']}")
    return f"  ({', '.join(parts)})" if parts else ""


def _metrics_table(data: dict[str, Any]) -> str:
    final, best = data["final"], data["best"]
    keys = [k for k in {**final, **best} if k not in ("kind",)]
    if not keys:
        return "  (none recorded)"
    rows = [[k, cell(final.get(k)), cell(best.get(k))] for k in keys]
    return "\n".join("  " + line for line in format_table(["metric", "final", "best"], rows).splitlines())


def diff_data(a: Run, b: Run) -> dict[str, Any]:
    """{"runs": [...], "config": {key: [a, b]}, "metrics": {key: [a, b]}}: differing config keys,
    and every metric either run has."""
    ca, cb = flatten(a.config), flatten(b.config)
    config = {k: [ca.get(k), cb.get(k)] for k in {**ca, **cb} if ca.get(k) != cb.get(k) or (k in ca) != (k in cb)}
    metrics: dict[str, list[Any]] = {}
    for key in ("status", "steps", "planned_steps", "wall_time_s", "world_size"):
        metrics[key] = [a.record()[key], b.record()[key]]
    for key in ("samples_per_s", "tokens_per_s"):
        pair = [a.summary.get(key), b.summary.get(key)]
        if any(v is not None for v in pair):
            metrics[key] = pair
    for prefix, fa, fb in (("final", a.final, b.final), ("best", a.best, b.best)):
        for key in {**fa, **fb}:
            metrics[f"{prefix}.{key}"] = [fa.get(key), fb.get(key)]
    return {"runs": [{"id": r.id, "dir": str(r.path)} for r in (a, b)], "config": config, "metrics": metrics}


def diff_text(a: Run, b: Run) -> str:
    data = diff_data(a, b)
    header = ["", f"A {a.id}", f"B {b.id}"]
    lines = [f"A {a.id}  {shown_path(a.path)}", f"B {b.id}  {shown_path(b.path)}", ""]
    if data["config"]:
        rows = [[k, cell(va), cell(vb)] for k, (va, vb) in data["config"].items()]
        lines += ["config keys that differ", _indent(format_table(["key", *header[1:]], rows))]
    else:
        lines.append("config: the same")
    rows = [[k, cell(va), cell(vb)] for k, (va, vb) in data["metrics"].items()]
    lines += ["", "metrics", _indent(format_table(["metric", *header[1:]], rows))]
    return "\n".join(lines)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
