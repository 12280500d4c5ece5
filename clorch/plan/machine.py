"""What an option needs of the job's machine: an optional package, CUDA GPUs, a compute capability.

An option says so with a `needs()` method returning `clorch.config.options.precision.Needs`
(`precision=fp8`: torchao and compute capability 8.9; `model.liger=true`: liger-kernel and
CUDA). The launching process checks them before anything starts: a package by finding its
module (not importing it), the GPUs' compute capability through `nvidia-smi`, so that CUDA is
never initialized here. What it cannot read of another machine (clorch.plan.where: the nodes
of a launcher plugin) the ranks check on their node.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from typing import Any

from clorch.config.checks import complete
from clorch.launch.gpus import visible_gpus
from clorch.builders.model import build_model_for
from clorch.plan.where import Machine
from clorch.plan.interrupted import reraise_interrupt

SECTIONS = ("precision", "model")  # the sections whose options may need something of the machine


def installed(module: str) -> bool:
    """Whether `module` can be imported here (found, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def compute_capabilities(devices: list[int] | None) -> list[tuple[int, int]] | None:
    """(major, minor) of each of these local CUDA devices (indices into the visible ones), read
    from `nvidia-smi`; None where it cannot be read."""
    visible = visible_gpus(os.environ)
    ids = [visible[i] for i in (devices or range(len(visible))) if i < len(visible)]
    if not ids:
        return None
    query = ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader", "-i", ",".join(ids)]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout
        return [tuple(int(part) for part in line.strip().split(".")[:2]) for line in out.split() if line.strip()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def _need_errors(need: Any, backend: str, devices: list[int] | None, machine: Machine | None = None) -> list[str]:
    """What `need` lacks on `machine` (None: this machine)."""
    errors = []
    software_here = machine is None or machine.software_here
    hardware_here = machine is None or machine.hardware_here
    if need.module and software_here and not installed(need.module):
        errors.append(
            f"{need.key} needs the {need.module} package, which is not installed here: "
            f"pip install 'clorch[{need.extra}]' (it needs a CUDA build of torch)"
        )
    if need.cuda and backend != "nccl":
        errors.append(
            f"{need.key} needs CUDA GPUs ({need.why}); this job runs on CPU ranks over {backend} "
            "(drop it to train on the CPU)"
        )
    elif need.capability is not None and hardware_here:  # elsewhere its ranks check it
        found = compute_capabilities(devices)
        low = sorted({c for c in found or () if c < need.capability})
        if low:
            want, got = ".".join(map(str, need.capability)), ", ".join(".".join(map(str, c)) for c in low)
            errors.append(f"{need.key} needs compute capability {want} or more ({need.why}); these GPUs have {got}")
    return errors


def liger_errors(cfg: Any) -> list[str]:
    """`model.liger=true` on a model Liger-Kernel has no kernels for: the model is built on the
    meta device to read its Hugging Face `model_type`. A model that cannot be built so is left
    to the other checks and to the ranks (which raise the same message)."""
    if not (complete(cfg, "model", "data") and getattr(cfg.model, "liger", False)):
        return []
    import torch  # lazy: clorch-train --help and --cfg job import clorch.plan without torch

    from clorch.nn.liger import unsupported  # lazy: it imports torch

    try:
        with torch.device("meta"):
            model = build_model_for(cfg)
    except Exception as exc:  # reported by the model checks, or built on the ranks
        reraise_interrupt(exc)
        return []
    problem = unsupported(model)
    return [problem] if problem else []


def machine_errors(cfg: Any, backend: str, devices: list[int] | None, machine: Machine | None = None) -> list[str]:
    """Errors for what the config's options need and `machine` lacks (empty: nothing lacks).

    Args:
        backend: the job's ("nccl" for CUDA ranks, "gloo" for CPU ranks).
        devices: a node's CUDA device indices, None for CPU ranks.
        machine: where the ranks run (None: this machine); what it has is checked where it can
            be read from here (clorch.plan.where), the rest by the ranks on their node.
    """
    errors = []
    for section in SECTIONS:
        if not complete(cfg, section):
            continue
        needs = getattr(getattr(cfg, section), "needs", None)
        for need in needs() if callable(needs) else ():
            errors += _need_errors(need, backend, devices, machine)
    return errors
