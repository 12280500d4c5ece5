"""The preflight as a run's first step: every rank checks its machine before anything is built.

`preflight=true` (the default on more than one node) runs `clorch.preflight.run_preflight`
in the ranks right after they joined the process group, and trains only if it passes;
`preflight=only` stops after it. The estimate it checks memory against is a rank's training
state (the whole model's under ddp, its share under fsdp), and the checkpoint directory's free
space the whole model's checkpoint; the model is counted on the meta device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from clorch.builders.data import model_sizes_of
from clorch.builders.model import build_model_for
from clorch.plan.plan import Plan
from clorch.train.metrics import announce
from clorch.preflight import run_preflight
from clorch.strategies import strategy_class


def _estimate(plan: Plan) -> dict[str, Any]:
    """What training this model keeps per parameter on each rank: fp32 weights (autocast
    computes in bf16/fp16 from fp32 weights), the gradients beside them, and the optimizer's
    buffers; under a sharding `parallel` mode each rank's share of them (none on the GPU with
    cpu_offload), while a checkpoint still holds the whole model."""
    cfg = plan.config
    sizes = model_sizes_of(cfg)  # on the host: a task may draw samples
    with torch.device("meta"):
        params = sum(p.numel() for p in build_model_for(cfg, sizes).parameters())
    states = cfg.optim.states()
    held = strategy_class(cfg.parallel).parameters_held(cfg.parallel, params, plan.world_size, plan.device_type)
    return {
        "model_params": held,
        "bytes_per_param": 4.0,
        "optimizer_states": states,
        "checkpoint_bytes": int(params * 4 * (1 + states)),
    }


def run_first(plan: Plan, run_dir: Path, checkpoint_dir: Path | None, rank: int) -> Any:
    """The preflight's verdict (clorch.preflight.PreflightResult), or None when the plan runs none.

    Every rank must call it, right after joining the process group: it is a
    sequence of collectives, each with the preflight's own deadline
    (`preflight.timeout_s`), so a missing or hung rank is named, never waited on
    for longer. Rank 0 writes preflight.json and announces the verdict in one line.
    """
    if plan.preflight == "false":
        return None

    result = run_preflight(plan.config.preflight, run_dir=run_dir, checkpoint_dir=checkpoint_dir, **_estimate(plan))
    if rank == 0:
        verdict = (
            f"preflight passed on {plan.world_size} rank(s) in {result.elapsed_s:.1f} s"
            if result.passed
            else f"preflight failed: {'; '.join(result.failures)}"
        )
        announce(run_dir, verdict)
    return result


def stops_here(plan: Plan, result: Any) -> bool:
    """Whether the run ends after its preflight: it failed, or the plan asked for nothing more."""
    return result is not None and (not result.passed or plan.preflight == "only")


def summary_of(result: Any) -> dict[str, Any]:
    """The preflight's figures for summary.json: the verdict, its time, and each rank's row."""
    record = result.to_dict()
    return {key: record[key] for key in ("passed", "failures", "elapsed_s", "ranks", "estimate", "table")}
