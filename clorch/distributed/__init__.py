"""Process groups, collectives, the launcher and rank-zero checkpoints.

The launcher and checkpoint functions live in `clorch.launch` and
`clorch.checkpoint`; they are re-exported here, where the user guide puts
them. The environment-variable helpers live in the torch-free `clorch.env`, so
the launcher process never imports torch.

The process-group lifecycle is the module `clorch.distributed.groups`; the
name `clorch.distributed.process_group` is its context manager.
"""

from __future__ import annotations

import importlib
from typing import Any

from torch.distributed import ReduceOp

from clorch.distributed.collectives import (
    OPS,
    Work,
    all_gather_into,
    all_reduce,
    all_to_all_single,
    barrier,
    broadcast,
    recv,
    reduce,
    reduce_scatter_into,
    send,
    wait,
)
from clorch.distributed.debug import CollectiveMismatchError
from clorch.distributed.groups import (
    backend,
    destroy_process_group,
    device,
    get_rank,
    get_world_size,
    init_process_group,
    is_initialized,
    local_rank,
    local_world_size,
    process_group,
    rank,
    world_size,
)
from clorch.env import DistEnv, read_env

# clorch.launch never imports clorch.distributed (or torch) at module level, so
# importing it here adds no cycle; it stays importable without torch on its own.
from clorch.launch import Job, await_job, job_logs, job_status, launch, stop_job

# Imported on first use, not here: the checkpoint functions sit above this
# package. clorch.checkpoint reads rank() and world_size() from it and unwraps
# models with clorch.nn.parallel, whose DDP and gradient scaler import
# clorch.distributed too. An import at this point would make
# `import clorch.checkpoint`, `import clorch.nn` or `import clorch.amp`, run
# first, fail on a partially initialized module.
_LAZY = {
    "save_checkpoint": "clorch.checkpoint",
    "load_checkpoint": "clorch.checkpoint",
}


def __getattr__(name: str) -> Any:
    """Import a name of `_LAZY` from its module on first access."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'clorch.distributed' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


__all__ = [
    "OPS",
    "Work",
    "CollectiveMismatchError",
    "DistEnv",
    "read_env",
    "all_gather_into",
    "all_reduce",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "recv",
    "reduce",
    "reduce_scatter_into",
    "send",
    "wait",
    "ReduceOp",
    "get_rank",
    "get_world_size",
    "launch",
    "Job",
    "job_status",
    "await_job",
    "job_logs",
    "stop_job",
    "backend",
    "destroy_process_group",
    "device",
    "init_process_group",
    "is_initialized",
    "local_rank",
    "local_world_size",
    "process_group",
    "rank",
    "world_size",
    *_LAZY,
]
