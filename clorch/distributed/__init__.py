"""Process groups, collectives, the launcher and rank-zero checkpoints.

The launcher and checkpoint functions live in `clorch.launch` and
`clorch.checkpoint`; they are re-exported here, where the user guide puts
them, and imported on first use. The environment-variable helpers live in the
torch-free `clorch.env`, so the launcher process never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

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
from torch.distributed import ReduceOp

from clorch.distributed.debug import CollectiveMismatchError
from clorch.env import DistEnv, read_env
from clorch.distributed.process_group import (
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

_LAZY = {
    "launch": "clorch.launch",
    "Job": "clorch.launch",
    "job_status": "clorch.launch",
    "await_job": "clorch.launch",
    "job_logs": "clorch.launch",
    "stop_job": "clorch.launch",
    "save_checkpoint": "clorch.checkpoint",
    "load_checkpoint": "clorch.checkpoint",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'clorch.distributed' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


__all__ = [
    "OPS", "Work", "CollectiveMismatchError", "DistEnv", "read_env",
    "all_gather_into", "all_reduce", "all_to_all_single", "barrier", "broadcast",
    "recv", "reduce", "reduce_scatter_into", "send", "wait",
    "ReduceOp", "get_rank", "get_world_size",
    "backend", "destroy_process_group", "device", "init_process_group", "is_initialized",
    "local_rank", "local_world_size", "process_group", "rank", "world_size",
    *_LAZY,
]
