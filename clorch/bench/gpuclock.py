"""The GPU's clock, power and temperature while a benchmark runs, sampled by `nvidia-smi`.

A step that keeps an H100/H200 busy draws it to its power limit, and the driver then lowers the
SM clock (1980 MHz at most on an H200, about 1650-1750 MHz at a 700 W cap). Throughput and MFU
follow the clock, so a figure means little without it: the benchmarks that report MFU print
what the GPU ran at during their timed blocks.

`nvidia-smi` runs as a separate process that samples every `interval_ms` and prints one CSV line
per sample; nothing here touches the GPU from the benchmark's own process, and no pause is
added between timed blocks (a pause lets a power-capped GPU recover and speeds up the block
after it).

That second process is not free on every machine: on a virtual machine with an H200 (16 vCPUs),
any process that wakes often (this sampler every 200 ms, or a loop sleeping 0.5 ms) made
host-bound eager steps 2-15% faster, as if idle CPUs were slow to wake. GPU-bound steps (a
compiled GPT-2) are not affected; `clorch-bench ddp` measures host-bound steps and samples only
when asked (`--gpu-sample-ms`).
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import tempfile
from dataclasses import dataclass

import torch

FIELDS = (
    "clocks.sm",
    "clocks.max.sm",
    "power.draw",
    "power.limit",
    "clocks_throttle_reasons.sw_power_cap",
    "temperature.gpu",
)


@dataclass(frozen=True)
class GpuSample:
    """One `nvidia-smi` reading."""

    sm_mhz: float
    max_sm_mhz: float  # the highest SM clock this GPU runs at
    power_w: float
    power_limit_w: float
    power_capped: bool  # the driver is lowering clocks to stay under the power limit
    temperature_c: float


def parse_line(line: str) -> GpuSample | None:
    """One CSV line of `nvidia-smi --query-gpu=<FIELDS> --format=csv,noheader,nounits`.

    Returns None for a line that is not a full reading (a field reported as `[N/A]`, a blank or
    partial line), so a GPU that lacks one sensor reports the others' lines as missing, not wrong.
    """
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != len(FIELDS):
        return None
    try:
        sm, top, power, limit, temp = (float(parts[i]) for i in (0, 1, 2, 3, 5))
    except ValueError:
        return None
    return GpuSample(sm, top, power, limit, parts[4].lower() == "active", temp)


def summarize(samples: list[GpuSample]) -> dict | None:
    """Medians and ranges of a list of readings; None when there are none."""
    if not samples:
        return None
    clocks = [s.sm_mhz for s in samples]
    return {
        "samples": len(samples),
        "sm_mhz": statistics.median(clocks),
        "sm_mhz_min": min(clocks),
        "sm_mhz_max": max(clocks),
        "max_sm_mhz": max(s.max_sm_mhz for s in samples),
        "power_w": statistics.median(s.power_w for s in samples),
        "power_limit_w": statistics.median(s.power_limit_w for s in samples),
        "power_capped": sum(s.power_capped for s in samples) / len(samples),
        "temperature_c_max": max(s.temperature_c for s in samples),
    }


def describe(summary: dict | None, problem: str | None = None) -> str:
    """One line for a benchmark's report (`problem`: why nothing was sampled, when known)."""
    if summary is None:
        return "GPU clock: not sampled" + (f" ({problem})" if problem else "")
    return (
        f"GPU during the timed blocks ({summary['samples']} nvidia-smi samples): SM clock median "
        f"{summary['sm_mhz']:.0f} MHz ({summary['sm_mhz_min']:.0f}-{summary['sm_mhz_max']:.0f}; "
        f"the GPU's highest {summary['max_sm_mhz']:.0f}), "
        f"power {summary['power_w']:.0f} W of {summary['power_limit_w']:.0f} W, "
        f"power cap lowering clocks in {100 * summary['power_capped']:.0f}% of samples, "
        f"up to {summary['temperature_c_max']:.0f} C"
    )


class GpuMonitor:
    """Samples one CUDA device with `nvidia-smi` while the `with` block runs.

    Args:
        device: the CUDA device to watch (found by its UUID, so CUDA_VISIBLE_DEVICES does not
            matter); a CPU device, or a machine without `nvidia-smi`, makes a monitor that
            samples nothing.
        interval_ms: time between samples; 0 samples nothing.

    After the block, `summary()` gives `summarize`'s dict, or None; `problem` says why nothing
    was sampled where that is known (no nvidia-smi, it did not start, it reported an error).
    Nothing here raises: a benchmark runs the same with or without its monitor.
    """

    def __init__(self, device: torch.device, interval_ms: int = 500) -> None:
        self._target = _device_id(device)
        self._interval_ms = interval_ms
        self._proc: subprocess.Popen | None = None
        self._files: list = []
        self._lines: list[str] = []
        self.problem: str | None = None

    def __enter__(self) -> "GpuMonitor":
        if self._target is None or self._interval_ms <= 0:
            return self
        smi = shutil.which("nvidia-smi")
        if smi is None:
            self.problem = "no nvidia-smi on PATH"
            return self
        # Files, not pipes: nothing reads them before the block ends, and a full pipe (64 KiB)
        # would stall nvidia-smi and leave the block's later part unsampled.
        self._files = [tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")]
        try:
            self._proc = subprocess.Popen(
                [
                    smi,
                    f"--query-gpu={','.join(FIELDS)}",
                    "--format=csv,noheader,nounits",
                    "-i",
                    self._target,
                    f"--loop-ms={self._interval_ms}",
                ],
                stdout=self._files[0],
                stderr=self._files[1],
                text=True,
            )
        except OSError as exc:
            self.problem = f"nvidia-smi did not start: {exc}"
            self._close()
        return self

    def __exit__(self, *exc) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass  # stuck in the driver: keep what it wrote, leave it to the OS
        out, err = (_read(f) for f in self._files)
        self._close()
        self._lines = out
        if not any(parse_line(line) for line in out):
            said = " ".join(line.strip() for line in out + err if line.strip())[-200:]
            self.problem = f"nvidia-smi gave no readings (exit status {self._proc.returncode}): {said}"

    def summary(self) -> dict | None:
        return summarize([s for s in map(parse_line, self._lines) if s is not None])

    def _close(self) -> None:
        for f in self._files:
            f.close()
        self._files = []


def _read(file) -> list[str]:
    file.seek(0)
    return file.read().splitlines()


def _device_id(device: torch.device) -> str | None:
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
