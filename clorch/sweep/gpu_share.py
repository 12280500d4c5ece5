"""Several small trials on one GPU (`hydra.sweeper.trials_per_gpu`): how many may share it.

A small model leaves most of a GPU idle: trials side by side on the same GPU (their slots name
the same device, clorch.sweep.slots) keep it busy. `trials_per_gpu=K` lets up to K trials
share each GPU; `n_jobs` still says how many run at once, so `n_jobs=8 trials_per_gpu=8` runs
eight trials on one GPU. `trials_per_gpu=auto` takes K from memory, so that no trial runs out
of it: the GPU's total memory (read with nvidia-smi: CUDA never starts in the sweep's process)
times HEADROOM, over the largest GPU memory any checked trial needs by its plan's estimate
(clorch.plan.checks.gpu_bytes_per_rank: training state, activations and CUDA's context). A
sweep whose trials' memory is not estimated (a model of your own) is refused `auto` and told
to give K. With `auto`, n_jobs above what the GPUs hold runs what they hold, and says so.
Without GPUs the key changes nothing (trials share no device on CPU: each has its own cores).
"""

from __future__ import annotations

from clorch.config.overrides import compose_once

HEADROOM = 0.9  # of a GPU's memory: the allocator's fragmentation and cuDNN's workspaces need the rest


def _human(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def largest_need(trial_lists: list[list[str]]) -> int | None:
    """The most GPU memory one rank of any of these trials needs by its plan's estimate; None when
    some trial's is not estimated."""
    # lazy: the plan's checks import torch, which a sweep's command line keeps out of its start
    from clorch.plan.checks import gpu_bytes_per_rank
    from clorch.plan.plan import plan_or_errors

    needs = []
    for overrides in trial_lists:
        cfg, _ = compose_once([o for o in overrides if not o.partition("=")[0].lstrip("+~").startswith("hydra")])
        plan = plan_or_errors(cfg)[0] if cfg is not None else None
        need = gpu_bytes_per_rank(plan.config, plan.nproc_per_node) if plan is not None else None
        if need is None:
            return None
        needs.append(need)
    return max(needs) if needs else None


def trials_per_gpu(value: int | str, trial_lists: list[list[str]], gpus: list[str]) -> tuple[int, str | None]:
    """(K, the line that says how `auto` chose it, or None) for hydra.sweeper.trials_per_gpu=`value`.

    Raises:
        ValueError: `auto` where the trials' memory or the GPU's cannot be known (the message
            names the key to set instead).
    """
    if value != "auto":
        return int(value), None
    if not gpus:
        return 1, None
    from clorch.plan.checks import gpu_total_memory  # lazy: see largest_need

    need, total = largest_need(trial_lists), gpu_total_memory(gpus)
    if need is None:
        raise ValueError(
            "hydra.sweeper.trials_per_gpu=auto needs each trial's GPU memory, which clorch estimates for its own "
            "models (model=gpt, model=mlp) only: set hydra.sweeper.trials_per_gpu=K, the trials one GPU holds"
        )
    if total is None:
        raise ValueError(
            "hydra.sweeper.trials_per_gpu=auto could not read the GPUs' memory with nvidia-smi: "
            "set hydra.sweeper.trials_per_gpu=K"
        )
    share = max(1, int(total * HEADROOM) // need)
    line = (
        f"trials_per_gpu=auto: a trial needs about {_human(need)} of GPU memory by its plan's estimate; "
        f"{HEADROOM:.0%} of a {_human(total)} GPU holds {share}"
    )
    return share, line
