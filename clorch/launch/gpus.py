"""How many ranks, on which GPUs, with which backend: decided without importing torch.

The launcher counts GPUs from CUDA_VISIBLE_DEVICES, else from the /dev/nvidiaN
device nodes, so that `launch()` stays fast in a process that never imported
torch; each GPU rank then sees exactly one device (its CUDA_VISIBLE_DEVICES).
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping


def visible_gpus(environ: Mapping[str, str]) -> list[str]:
    """The CUDA device ids this process may use, as CUDA_VISIBLE_DEVICES entries."""
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        entries = []
        for item in listed.split(","):
            item = item.strip()
            if not item or item.startswith("-"):
                break  # CUDA ignores everything from the first invalid entry on
            entries.append(item)
        return entries
    try:
        names = os.listdir("/dev")
    except OSError:
        return []
    return sorted((m.group(1) for m in map(re.compile(r"^nvidia(\d+)$").match, names) if m), key=int)


def _check_devices(devices: Any, visible: list[str], problems: list[str]) -> list[int] | None:
    if (
        not isinstance(devices, (list, tuple))
        or not devices
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices)
    ):
        problems.append(f"devices must be a non-empty list of CUDA device indices >= 0, got {devices!r}")
        return None
    if len(set(devices)) != len(devices):
        twice = sorted({d for d in devices if list(devices).count(d) > 1})
        problems.append(
            f"devices must be distinct (one GPU per local rank), got {list(devices)!r}: {twice} appear more than once"
        )
        return None
    if not visible:
        problems.append(
            f"devices {list(devices)!r} were given but no CUDA GPU is visible on this "
            "machine: leave devices=None to run CPU ranks"
        )
        return None
    missing = [d for d in devices if d >= len(visible)]
    if missing:
        problems.append(
            f"devices {missing} do not exist: {len(visible)} CUDA device(s) visible (indices 0..{len(visible) - 1})"
        )
        return None
    return list(devices)


def _check_nproc(nproc: Any, problems: list[str]) -> bool:
    if nproc is not None and not (isinstance(nproc, int) and not isinstance(nproc, bool) and nproc >= 1):
        problems.append(f"nproc_per_node must be None or an integer >= 1, got {nproc!r}")
        return False
    return True


def resolve_ranks(
    nproc: Any, devices: Any, backend: Any, environ: Mapping[str, str], problems: list[str]
) -> tuple[int, list[str] | None, str | None]:
    """(ranks per node, CUDA_VISIBLE_DEVICES per rank or None, resolved backend).

    GPU ranks: `devices` given, or backend "auto"/"nccl" with GPUs visible.
    Problems are appended to `problems`; the returned values are then placeholders.
    """
    visible = visible_gpus(environ)
    nproc_ok = _check_nproc(nproc, problems)
    use_gpus = devices is not None or (backend in ("auto", "nccl") and bool(visible))
    if backend == "nccl" and not visible:
        problems.append(
            "backend 'nccl' needs CUDA GPUs, but none is visible on this machine: "
            "use backend='gloo' or 'auto' for CPU ranks"
        )
    if not use_gpus:
        resolved = "gloo" if backend == "auto" else backend
        return (nproc if nproc_ok and nproc is not None else 2), None, resolved
    resolved = "nccl" if backend == "auto" else backend
    if devices is None:
        if nproc_ok and nproc is not None and nproc > len(visible):
            problems.append(
                f"nproc_per_node={nproc} asks for {nproc} GPU ranks but only {len(visible)} "
                "CUDA device(s) are visible: pass fewer ranks, or backend='gloo' for CPU ranks"
            )
            return 1, None, resolved
        count = len(visible) if nproc is None or not nproc_ok else nproc
        return count, visible[:count], resolved
    checked = _check_devices(devices, visible, problems)
    if checked is None:
        return 1, None, resolved
    if nproc_ok and nproc is not None and nproc != len(checked):
        problems.append(
            f"nproc_per_node={nproc} does not match devices {checked} ({len(checked)} GPU ranks, one per device)"
        )
    return len(checked), [visible[d] for d in checked], resolved
