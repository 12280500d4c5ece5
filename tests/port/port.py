"""Run `torch_ddp_script.py` as written (torch's classes) or ported to clorch by its imports alone."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch
import torch.distributed as dist

SCRIPT = Path(__file__).with_name("torch_ddp_script.py")
TORCH_IMPORTS = """from torch.amp import GradScaler, autocast
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler
"""
CLORCH_IMPORTS = """from clorch.amp import GradScaler, autocast
from clorch.nn.parallel import DistributedDataParallel as DDP
from clorch.data import DistributedSampler
"""


def source(flavor: str) -> str:
    """The script's text; for "clorch" with the import block swapped (and nothing else)."""
    text = SCRIPT.read_text()
    assert text.count(TORCH_IMPORTS) == 1, "the import block of torch_ddp_script.py changed"
    return text if flavor == "torch" else text.replace(TORCH_IMPORTS, CLORCH_IMPORTS)


def load(flavor: str):
    name = f"_port_script_{flavor}"
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(compile(source(flavor), str(SCRIPT), "exec"), module.__dict__)  # noqa: S102 - our own file
    sys.modules[name] = module
    return module


def run_both(rank: int, world_size: int, backend: str, options: dict, flavors=("torch", "clorch")):
    """One rank: init the group the torchrun way, train once per flavor, return the results.

    A flavor ending in "_again" reruns the same flavor (the run-to-run noise floor).
    """
    dist.init_process_group(backend)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    try:
        return {flavor: load(flavor.removesuffix("_again")).train(**options) for flavor in flavors}
    finally:
        dist.destroy_process_group()
