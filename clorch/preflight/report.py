"""The verdict: per-rank rows compared across ranks, failure lines, the table and preflight.json.

Rank 0 builds it from every rank's row (or each rank alone, when rank 0 is the
one missing). A failure line names the rank and its host and says what to look
at: "rank 3 on host b: matmul 212 TFLOP/s, 0.61 of the median 347" (of host b's
ranks; a whole slow host is compared with the other hosts).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

VERSION_KEYS = ("torch", "cuda", "cudnn", "nccl", "clorch")
_NAMED = 8  # ranks named in one line before "and N more"


@dataclass
class PreflightResult:
    """What the preflight found.

    Attributes:
        passed: True when nothing failed.
        failures: one line per problem, naming the rank and host.
        table: the per-rank table as text, for the console.
        ranks: one row (a dict) per rank that reported, in rank order.
        estimate: the memory and checkpoint estimate and how it was made.
        options: the options the preflight ran with.
        elapsed_s: seconds the preflight took on the rank that built the verdict.
    """

    passed: bool
    failures: list[str]
    table: str
    ranks: list[dict[str, Any]] = field(default_factory=list)
    estimate: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain values, as written to preflight.json."""
        return {
            "passed": self.passed,
            "failures": list(self.failures),
            "table": self.table,
            "ranks": self.ranks,
            "estimate": self.estimate,
            "options": self.options,
            "elapsed_s": self.elapsed_s,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PreflightResult:
        return cls(**data)


def where(rank: int, known: dict[int, dict[str, Any]]) -> str:
    """ "rank 3 on host b", with the host guessed from the launch layout for a rank never heard from.

    clorch's launcher and torchrun number a node's ranks consecutively from
    node_rank * local_world_size, so a silent rank's node is the one whose
    block of ranks holds it.
    """
    if rank in known:
        return f"rank {rank} on host {known[rank]['host']}"
    for info in known.values():
        start = info["rank"] - info["local_rank"]
        if start <= rank < start + info["local_world_size"]:
            return f"rank {rank} (on host {info['host']}, by the launch layout)"
    return f"rank {rank} (host unknown)"


def _ranks_text(ranks: list[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:_NAMED])
    more = f" and {len(ranks) - _NAMED} more" if len(ranks) > _NAMED else ""
    return f"rank{'s' if len(ranks) > 1 else ''} {shown}{more}"


def version_failures(rows: dict[int, dict[str, Any]]) -> list[tuple[list[int], str]]:
    """(rank, line) for each rank whose torch, CUDA, cuDNN, NCCL or clorch version differs from the most common."""
    lines = []
    for key in VERSION_KEYS:
        by_value: dict[str, list[int]] = {}
        for rank, row in sorted(rows.items()):
            by_value.setdefault(row["versions"][key], []).append(rank)
        if len(by_value) < 2:
            continue
        common = max(by_value, key=lambda v: (len(by_value[v]), -by_value[v][0]))
        for value, ranks in by_value.items():
            if value != common:
                lines += [
                    ([r], f"{where(r, rows)}: {key} {value}, while {_ranks_text(by_value[common])} have {common}")
                    for r in ranks
                ]
    return lines


def slow_failures(
    rows: dict[int, dict[str, Any]], slow_ratio: float, disk_slow_ratio: float = 0.0
) -> list[tuple[list[int], str]]:
    """(ranks, line) for each rank, and each host, below `slow_ratio` of its peers' median GEMM
    TFLOP/s, or below `disk_slow_ratio` of their checkpoint write MB/s.

    Two comparisons, never one across everything: each rank against the
    median of its own host's ranks, and each host (the median of its ranks)
    against the median of the hosts. A host's ranks share its load, its
    cores (on the CPU) and its disk, so a busy host moves all of them
    together: they stay equal among themselves, and the host is judged once,
    not once per rank. The default ratio, 0.7, sits between what was
    measured (docs/scale-out.md, "Checking the machines first"): healthy
    CPU ranks of a busy 2-core host came within 0.71 of each other, 0.83 of
    their median at worst, and one rank at a quarter of its peers' speed is
    0.4 of the median of two ranks (0.25 among more).

    A write to disk is judged more loosely: hosts may share one filesystem
    (and do in a test on one machine), and a write + fsync waits for every
    other writer's data too; only a disk far slower than the others' says
    something about its host.
    """
    lines: list[tuple[list[int], str]] = []
    for key, name, unit, ratio in (
        ("tflops", "matmul", "TFLOP/s", slow_ratio),
        ("disk_mb_s", "checkpoint write", "MB/s", disk_slow_ratio),
    ):
        if ratio <= 0:
            continue
        measured = {r: row[key] for r, row in rows.items() if row.get(key) is not None}
        by_host: dict[str, dict[int, float]] = {}
        for rank, value in sorted(measured.items()):
            by_host.setdefault(rows[rank]["host"], {})[rank] = value
        lines += _slow_ranks_of_each_host(rows, by_host, name, unit, ratio)
        lines += _slow_hosts(rows, by_host, name, unit, ratio)
    return lines


def _slow_ranks_of_each_host(
    rows: dict[int, dict[str, Any]], by_host: dict[str, dict[int, float]], name: str, unit: str, ratio: float
) -> list[tuple[list[int], str]]:
    """Each rank below `ratio` of the median of its own host's ranks (hosts of two ranks or more)."""
    lines: list[tuple[list[int], str]] = []
    for ranks in by_host.values():
        if len(ranks) < 2:
            continue
        median = statistics.median(ranks.values())
        lines += [
            ([rank], f"{where(rank, rows)}: {name} {value:.3g} {unit}, {value / median:.2f} of the median {median:.3g}")
            for rank, value in ranks.items()
            if value < ratio * median
        ]
    return lines


def _slow_hosts(
    rows: dict[int, dict[str, Any]], by_host: dict[str, dict[int, float]], name: str, unit: str, ratio: float
) -> list[tuple[list[int], str]]:
    """Each host (the median of its ranks) below `ratio` of the median of the hosts (two or more)."""
    if len(by_host) < 2:
        return []
    lines: list[tuple[list[int], str]] = []
    host_medians = {host: statistics.median(ranks.values()) for host, ranks in by_host.items()}
    median = statistics.median(host_medians.values())
    for host, value in host_medians.items():
        if value < ratio * median:
            ranks = sorted(by_host[host])
            who = where(ranks[0], rows) if len(ranks) == 1 else f"host {host} ({_ranks_text(ranks)})"
            lines.append(
                (
                    ranks,
                    f"{who}: {name} {value:.3g} {unit}{' (median)' if len(ranks) > 1 else ''}, "
                    f"{value / median:.2f} of the median {median:.3g} of the "
                    f"{len(host_medians)} hosts",
                )
            )
    return lines


def shared_device_failures(rows: dict[int, dict[str, Any]]) -> list[tuple[list[int], str]]:
    """(ranks, line) for each CUDA device that more than one rank of a host drives."""
    owners: dict[tuple[str, str], list[int]] = {}
    for rank, row in sorted(rows.items()):
        if row.get("device_uuid"):
            owners.setdefault((row["host"], row["device_uuid"]), []).append(rank)
    return [
        (
            ranks,
            f"{_ranks_text(ranks)} on host {host} share CUDA device {uuid} ({rows[ranks[0]]['device']}): "
            "each rank needs its own (CUDA_VISIBLE_DEVICES per rank, or fewer ranks per node)",
        )
        for (host, uuid), ranks in owners.items()
        if len(ranks) > 1
    ]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _largest(values: dict | None) -> float | None:
    return values[max(values, key=int)] if values else None


def table(
    rows: dict[int, dict[str, Any]], missing: dict[int, str], world_size: int, failed: set[int], hosts: dict[int, str]
) -> str:
    """The per-rank table as aligned text: a rank in `failed` says FAIL; one without a row, its host
    (from `hosts`, where known) and whether it is missing."""
    header = [
        "rank",
        "host",
        "device",
        *VERSION_KEYS,
        "dev free GiB",
        "host free GiB",
        "GEMM TFLOP/s",
        "disk MB/s",
        "busbw GB/s",
        "nodes busbw GB/s",
        "p2p ms",
        "status",
    ]
    lines = [header]
    for rank in range(world_size):
        row = rows.get(rank)
        if row is None:
            lines.append(
                [str(rank), hosts.get(rank, "?"), *["-"] * (len(header) - 3), "missing" if rank in missing else "-"]
            )
            continue
        lines.append(
            [
                str(rank),
                row["host"],
                row["device"],
                *(row["versions"][k] for k in VERSION_KEYS),
                *(_cell(row.get(k)) for k in ("device_free_gib", "host_free_gib", "tflops", "disk_mb_s")),
                _cell(_largest(row.get("busbw_gb_s"))),
                _cell(_largest(row.get("internode_busbw_gb_s"))),
                _cell(row.get("p2p_ms")),
                "FAIL" if rank in failed else "ok",
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines)


def verdict(
    rows: dict[int, dict[str, Any]],
    missing: dict[int, str],
    world_size: int,
    slow_ratio: float,
    estimate: dict[str, Any],
    options: dict[str, Any],
    elapsed_s: float,
    hosts: dict[int, str] | None = None,
    disk_slow_ratio: float = 0.0,
) -> PreflightResult:
    """Compare the rows, collect every failure, and lay out the table.

    Args:
        rows: rank -> the row it reported.
        missing: rank -> the failure line for a rank that did not arrive or report.
        hosts: rank -> host, for the table's rows of ranks that sent no row.
    """
    failures = [missing[r] for r in sorted(missing)]
    failed = {rank for rank, row in rows.items() if row["failures"]}
    for rank, row in sorted(rows.items()):
        failures += [f"{where(rank, rows)}: {line}" for line in row["failures"]]
    compared = version_failures(rows) + shared_device_failures(rows)
    for ranks, line in compared + slow_failures(rows, slow_ratio, disk_slow_ratio):
        failed.update(ranks)
        failures.append(line)
    return PreflightResult(
        passed=not failures,
        failures=failures,
        table=table(rows, missing, world_size, failed, hosts or {}),
        ranks=[rows[r] for r in sorted(rows)],
        estimate=estimate,
        options=options,
        elapsed_s=elapsed_s,
    )


def format_report(result: PreflightResult) -> str:
    """The console report: the estimate, the table, then PASSED or each failure."""
    head = f"preflight: {result.estimate.get('text', '')}"
    tail = (
        "preflight PASSED"
        if result.passed
        else "preflight FAILED:\n" + "\n".join(f"  {line}" for line in result.failures)
    )
    return f"{head}\n{result.table}\n{tail}"
