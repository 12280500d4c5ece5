"""A worker written for clorch.distributed.process_group(), run under torchrun by test_torchrun.py.

Usage: torchrun --standalone --nproc-per-node 2 tests/launch/torchrun_worker.py OUT_DIR
"""

import json
import os
import sys

import torch

from clorch.distributed import all_reduce, local_rank, process_group, rank, world_size

with process_group(backend="gloo"):
    gen = torch.Generator().manual_seed(2000 + rank())
    tensor = torch.randn(4, generator=gen, dtype=torch.float64)
    all_reduce(tensor)
    report = {
        "rank": rank(),
        "world_size": world_size(),
        "local_rank": local_rank(),
        "sum": tensor.tolist(),
        "torchelastic": "TORCHELASTIC_RUN_ID" in os.environ,
    }
    with open(os.path.join(sys.argv[1], f"rank_{rank()}.json"), "w") as handle:
        json.dump(report, handle)
