"""Checks a rank runs on itself: device, versions, memory, GEMM speed, checkpoint directory.

No communication here. Each check adds numbers to the rank's row and, when
something is wrong that this rank alone can tell, a failure line naming it.
Comparisons across ranks (versions, speed against the median, two ranks on one
device) are `clorch.preflight.report`'s.
"""

from __future__ import annotations

import os
import shutil
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from clorch._version import __version__
from clorch._files import unique_token
from clorch.preflight import timing
from clorch.preflight.options import PreflightConfig

GIB = 1 << 30
MIB = 1 << 20


def human_bytes(nbytes: float) -> str:
    """`nbytes` in the largest binary unit that keeps it >= 1: "1.5 GiB", "12 KiB"."""
    value, units = float(nbytes), ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    for unit in units[:-1]:
        if abs(value) < 1024:
            return f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} {units[-1]}"


@dataclass(frozen=True)
class Estimate:
    """What the config needs per rank, from the model's size (activations not included).

    Attributes:
        model_params: parameters of the model.
        bytes_per_param: bytes of one parameter as stored (4 for fp32 weights, 2 for bf16).
        optimizer_states: parameter-sized optimizer buffers (2 for Adam/AdamW, 1 for SGD with
            momentum, 0 for plain SGD), at `bytes_per_param` each.
        checkpoint_bytes: expected size of one checkpoint; None: weights plus optimizer state.
    """

    model_params: int
    bytes_per_param: float
    optimizer_states: float
    checkpoint_bytes: int | None = None

    @property
    def train_bytes(self) -> int:
        """Weights, gradients and optimizer state."""
        return int(self.model_params * self.bytes_per_param * (2 + self.optimizer_states))

    @property
    def ckpt_bytes(self) -> int:
        if self.checkpoint_bytes is not None:
            return int(self.checkpoint_bytes)
        return int(self.model_params * self.bytes_per_param * (1 + self.optimizer_states))

    def describe(self) -> str:
        """The estimate and how it was made, for the console and preflight.json."""
        return (
            f"{self.model_params:,} params x {self.bytes_per_param:g} B x (weights + gradients + "
            f"{self.optimizer_states:g} optimizer states) = {human_bytes(self.train_bytes)} per rank "
            f"(activations not included); checkpoint {human_bytes(self.ckpt_bytes)}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "train_bytes": self.train_bytes,
            "checkpoint_bytes": self.ckpt_bytes,
            "text": self.describe(),
        }


def hostname() -> str:
    """This machine's name as the table shows it."""
    return socket.gethostname()


def versions() -> dict[str, str]:
    """The versions every rank must share: torch, CUDA, cuDNN, NCCL, clorch ("-": not present)."""
    cuda = torch.version.cuda or "-"
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    nccl = "-"
    if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
        raw = torch.cuda.nccl.version()
        nccl = ".".join(str(part) for part in raw) if isinstance(raw, tuple) else str(raw)
    return {
        "torch": torch.__version__,
        "cuda": cuda,
        "cudnn": str(cudnn) if cudnn else "-",
        "nccl": nccl,
        "clorch": __version__,
    }


def device_identity(device: torch.device) -> dict[str, Any]:
    """Which device this rank drives: name, index, uuid (None on the CPU); a failure if not visible."""
    if device.type != "cuda":
        return {"device": "cpu", "device_uuid": None, "failure": None}
    if not torch.cuda.is_available() or device.index is None or device.index >= torch.cuda.device_count():
        return {
            "device": str(device),
            "device_uuid": None,
            "failure": f"CUDA device {device} is not visible ({torch.cuda.device_count()} visible; "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})",
        }
    props = torch.cuda.get_device_properties(device.index)
    return {
        "device": f"cuda:{device.index} {props.name}",
        "device_uuid": str(getattr(props, "uuid", device.index)),
        "failure": None,
    }


def host_available_bytes() -> int | None:
    """Memory the host can still give (MemAvailable), or None where that is not known."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def memory(device: torch.device, estimate: Estimate, ranks_on_host: int) -> dict[str, Any]:
    """Free device and host memory against the estimate; a failure when too little is free.

    On a GPU the estimate is per device. On the CPU the host's ranks share its
    memory, so the host must hold the estimate once per rank on it.
    """
    host_free = host_available_bytes()
    need = estimate.train_bytes
    row: dict[str, Any] = {
        "host_free_gib": None if host_free is None else host_free / GIB,
        "device_free_gib": None,
        "need_gib": need / GIB,
        "failure": None,
    }
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        row["device_free_gib"] = free / GIB
        if free < need:
            row["failure"] = (
                f"{human_bytes(free)} of device memory free, the model needs an estimated "
                f"{human_bytes(need)} ({estimate.describe()})"
            )
    elif host_free is not None and host_free < need * ranks_on_host:
        row["failure"] = (
            f"{human_bytes(host_free)} of host memory available for {ranks_on_host} rank(s), "
            f"the model needs an estimated {human_bytes(need)} each ({estimate.describe()})"
        )
    return row


def gemm(device: torch.device, options: PreflightConfig) -> dict[str, Any]:
    """The timed GEMM: TFLOP/s (read through `timing` at call time, where tests may wrap it)."""
    n = options.gemm_size(device.type == "cuda")
    tflops = timing.matmul_tflops(n, device, options.matmul_repeats)
    return {"tflops": tflops, "gemm": f"{n}x{n} {'bf16' if device.type == 'cuda' else 'fp32, one core'}"}


def _nearest_existing(directory: Path) -> Path:
    path = directory.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def checkpoint_dir(directory: Path, estimate: Estimate, options: PreflightConfig, timed: bool) -> dict[str, Any]:
    """Free space for one checkpoint, and (when `timed`) a write + fsync of a file of that order.

    A directory that does not exist yet is judged by its nearest existing
    ancestor, where the run will create it; the preflight creates nothing that
    stays: its file is removed after the write.
    """
    row: dict[str, Any] = {"disk_free_gib": None, "disk_mb_s": None, "failure": None}
    target = _nearest_existing(directory.expanduser())
    if not target.is_dir():
        row["failure"] = f"checkpoint directory {directory} cannot be created: {target} is not a directory"
        return row
    free = shutil.disk_usage(target).free
    row["disk_free_gib"] = free / GIB
    need = estimate.ckpt_bytes
    if free < need:
        row["failure"] = (
            f"checkpoint directory {directory} has {human_bytes(free)} free, a checkpoint "
            f"needs an estimated {human_bytes(need)}"
        )
        return row
    if timed:
        size = max(min(need, options.disk_write_mb * MIB), MIB)
        try:
            row["disk_mb_s"] = timing.write_mb_per_s(target, size, f".clorch-preflight-{unique_token()}.tmp")
        except OSError as exc:
            row["failure"] = f"checkpoint directory {directory} is not writable: {exc.strerror or exc} ({target})"
    return row
