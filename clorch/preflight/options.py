"""The preflight's options: a typed dataclass and the check of its values.

Torch-free, so that the config code can import it and check a config before
any process starts. `PreflightConfig.errors()` lists every bad value at once;
`validate()` raises them together as one ValueError.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional, Union

MODES = ("auto", "false", "true", "only")
DISK_CHECKS = ("host_leaders", "all", "none")

# Defaults that depend on where the preflight runs (a config is composed before the device is known).
CPU_ALLREDUCE_SIZES_MB = [1, 4]  # gloo on a CPU moves a few hundred MB/s: keep the preflight to seconds
GPU_ALLREDUCE_SIZES_MB = [1, 16, 64, 256]  # 256 MiB reaches NCCL's bus bandwidth plateau
CPU_MATMUL_SIZE = 512  # fp32 on one core: ~3 ms a multiply, compute-bound (each input element used 512 times)
GPU_MATMUL_SIZE = 8192  # bf16 on a data-centre GPU: ~1 ms, long enough to reach full clocks


def normalize_mode(mode: Any) -> str:
    """ "auto" | "false" | "true" | "only" from a bool or one of those strings (any case).

    Raises:
        ValueError: anything else, naming the value and the choices.
    """
    if isinstance(mode, bool):
        return "true" if mode else "false"
    if isinstance(mode, str) and mode.strip().lower() in MODES:
        return mode.strip().lower()
    raise ValueError(f"preflight.mode must be one of {', '.join(MODES)} (or a bool), got {mode!r}")


@dataclass
class PreflightConfig:
    """How the preflight checks the job's machines before training."""

    # auto: true on more than one node, else false; false: none; true: check, then train; only: check and stop
    mode: Union[bool, str] = "auto"
    # fails a rank below this fraction of its host's ranks' median GEMM TFLOP/s, and a host below it of the
    # hosts' median; 0 turns it off
    slow_ratio: float = 0.7
    disk_slow_ratio: float = (
        0.25  # fails a host whose checkpoint write MB/s is below this fraction of the hosts' median; 0 turns it off
    )
    timeout_s: float = 30.0  # seconds each wait may take: arrival, each collective, the exchange of results
    allreduce_sizes_mb: Optional[list[int]] = (
        None  # MiB per timed all-reduce; None: [1, 16, 64, 256] on GPU, [1, 4] on CPU
    )
    allreduce_iters: int = 3  # timed all-reduces per size, after one untimed warm-up
    matmul_size: Optional[int] = None  # n of the n x n GEMM; None: 8192 on GPU (bf16), 512 on CPU (fp32)
    matmul_repeats: int = 5  # timings of >= 20 ms of GEMMs each, after a warm-up; their median counts
    disk_check: str = (
        "host_leaders"  # ranks that time a checkpoint write: host_leaders (lowest rank per host), all, none
    )
    disk_write_mb: int = 64  # cap on the timed write, MiB (the expected checkpoint size when that is smaller)
    p2p_mb: int = 1  # MiB sent to the next rank and echoed back in the round trip

    def errors(self) -> list[str]:
        """Every bad value, one message each naming the key, the rule and the value."""
        errors = []
        try:
            normalize_mode(self.mode)
        except ValueError as exc:
            errors.append(str(exc))
        errors += _number_errors(self)
        sizes = self.allreduce_sizes_mb
        if sizes is not None and (not _is_list(sizes) or not sizes or not all(_is_int(s) and s > 0 for s in sizes)):
            errors.append(
                f"preflight.allreduce_sizes_mb must be a non-empty list of positive ints (MiB) "
                f"or null for the device's default, got {sizes!r}"
            )
        if self.disk_check not in DISK_CHECKS:
            errors.append(f"preflight.disk_check must be one of {', '.join(DISK_CHECKS)}, got {self.disk_check!r}")
        return errors

    def rules(self, cfg: Any) -> list[str]:
        """The config checks' hook (clorch.config.registry.Option): `errors()`."""
        return self.errors()

    def validate(self) -> PreflightConfig:
        """Return self when every value is good.

        Raises:
            ValueError: every bad value, one per line.
        """
        errors = self.errors()
        if errors:
            raise ValueError("\n".join(errors))
        return self

    @property
    def run_mode(self) -> str:
        """The mode as one of "false", "true", "only", for a job on one node."""
        return self.mode_for(nodes=1)

    def mode_for(self, nodes: int) -> str:
        """The mode as one of "false", "true", "only" for a job on `nodes` nodes: "auto" checks
        the machines of a job that spans more than one node, where a bad node is the common
        cause of a hang at the start."""
        mode = normalize_mode(self.mode)
        if mode == "auto":
            return "true" if nodes > 1 else "false"
        return mode

    def sizes_mb(self, on_gpu: bool) -> list[int]:
        """The all-reduce sizes in MiB, the device's default when none were given."""
        if self.allreduce_sizes_mb is not None:
            return [int(s) for s in self.allreduce_sizes_mb]
        return list(GPU_ALLREDUCE_SIZES_MB if on_gpu else CPU_ALLREDUCE_SIZES_MB)

    def gemm_size(self, on_gpu: bool) -> int:
        """n of the timed n x n GEMM, the device's default when none was given."""
        if self.matmul_size is not None:
            return int(self.matmul_size)
        return GPU_MATMUL_SIZE if on_gpu else CPU_MATMUL_SIZE

    def to_dict(self) -> dict[str, Any]:
        """The options as plain values (for preflight.json)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_list(value: Any) -> bool:
    # OmegaConf hands a ListConfig, which is a Sequence but not a list.
    return not isinstance(value, (str, bytes)) and hasattr(value, "__len__") and hasattr(value, "__iter__")


def _number_errors(cfg: PreflightConfig) -> list[str]:
    errors = []
    for key in ("slow_ratio", "disk_slow_ratio"):
        ratio = getattr(cfg, key)
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio < 1:
            errors.append(f"preflight.{key} must be a fraction in [0, 1) (0 turns the comparison off), got {ratio!r}")
    timeout = cfg.timeout_s
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        errors.append(f"preflight.timeout_s must be > 0 (seconds), got {timeout!r}")
    positive = {
        "allreduce_iters": "timed all-reduces per size",
        "matmul_repeats": "timed GEMMs",
        "disk_write_mb": "MiB",
        "p2p_mb": "MiB",
    }
    for key, unit in positive.items():
        value = getattr(cfg, key)
        if not _is_int(value) or value <= 0:
            errors.append(f"preflight.{key} must be an int > 0 ({unit}), got {value!r}")
    size = cfg.matmul_size
    if size is not None and (not _is_int(size) or size <= 0):
        errors.append(
            f"preflight.matmul_size must be an int > 0 (n of the n x n GEMM) or null for the "
            f"device's default, got {size!r}"
        )
    return errors
