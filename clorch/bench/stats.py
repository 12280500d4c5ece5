"""Small helpers shared by the benchmarks: timing, medians, ratios, tables."""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence


def timed(fn: Callable[[], object], sync: Callable[[], object] | None = None) -> float:
    """Seconds one call of `fn` takes; `sync` (e.g. torch.cuda.synchronize) runs before each clock read."""
    if sync:
        sync()
    start = time.perf_counter()
    fn()
    if sync:
        sync()
    return time.perf_counter() - start


def interleave(candidates: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Run each candidate once per round, rotating the order each round (A B, B A, ...).

    Each candidate returns its own measurement (seconds); the result lists them per name.
    """
    names = list(candidates)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(candidates[name]())
    return samples


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table (readable in a terminal, pasteable into docs/performance.md)."""
    cells = [[str(h) for h in headers]] + [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.rjust(w) for c, w in zip(row, widths)) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        if value == 0 or 1e-3 <= abs(value) < 1e6:
            return f"{value:.4g}" if abs(value) < 1 else f"{value:.3f}".rstrip("0").rstrip(".")
        return f"{value:.3e}"
    return str(value)


def human_bytes(size: float) -> str:
    """4 B, 1 KiB, 256 MiB, 4 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:g} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
