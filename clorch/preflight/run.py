"""`run_preflight`: the ranks meet, check themselves and each other, and agree on a verdict.

Order on every rank, each wait with its own deadline of `timeout_s`:

1. arrive: post host and layout to the store; a rank absent at the deadline
   is named and nothing else runs (a collective would wait for it forever);
   with everyone present, make the preflight's own process groups;
2. local checks (`clorch.preflight.local`): device, versions, memory, GEMM,
   checkpoint directory;
3. group checks (`clorch.preflight.group`): all-reduce bus bandwidth, the
   nodes' leaders, the round trip to the next rank;
4. report: post the row; rank 0 gathers the rows, builds the verdict
   (`clorch.preflight.report`), writes preflight.json and posts the verdict,
   which every other rank reads.

While it works each rank posts what it is doing, so a rank that never
reports is named with the step it was last seen in.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any, Mapping

import torch.distributed as dist

from clorch._files import write_json_atomic
from clorch.distributed import groups as pg
from clorch.preflight import local, meeting, report
from clorch.preflight.group import failure_line, group_checks, make_groups
from clorch.preflight.options import PreflightConfig
from clorch.preflight.report import PreflightResult

_calls = itertools.count()  # every rank calls run_preflight equally often, so the n-th calls share keys


def _options(options: PreflightConfig | Mapping[str, Any]) -> PreflightConfig:
    if isinstance(options, PreflightConfig):
        return options.validate()
    if isinstance(options, Mapping):
        return PreflightConfig(**dict(options)).validate()
    raise TypeError(f"options must be a PreflightConfig or a mapping of its fields, got {type(options).__name__}")


def _estimate(model_params: Any, bytes_per_param: Any, optimizer_states: Any, checkpoint_bytes: Any) -> local.Estimate:
    def number(name: str, value: Any, kind: type | tuple = (int, float)) -> None:
        if isinstance(value, bool) or not isinstance(value, kind) or value < 0:
            raise ValueError(f"{name} must be a number >= 0, got {value!r}")

    number("model_params", model_params, int)
    number("bytes_per_param", bytes_per_param)
    number("optimizer_states", optimizer_states)
    if checkpoint_bytes is not None:
        number("checkpoint_bytes", checkpoint_bytes, int)
    return local.Estimate(model_params, bytes_per_param, optimizer_states, checkpoint_bytes)


def _local_row(
    rank: int,
    hosts: list[str],
    options: PreflightConfig,
    estimate: local.Estimate,
    checkpoint_dir: Path | None,
    stage: Any,
) -> dict[str, Any]:
    """This rank's own checks, as one row with the failures only it can see."""
    device = pg.device()
    host = hosts[rank]
    row: dict[str, Any] = {
        "rank": rank,
        "host": host,
        "local_rank": pg.local_rank(),
        "local_world_size": pg.local_world_size(),
        "versions": local.versions(),
        "failures": [],
    }
    stage("device")
    parts = [local.device_identity(device)]
    if parts[0]["failure"] is None:
        stage("memory")
        parts.append(local.memory(device, estimate, hosts.count(host)))
        stage("matmul")
        parts.append(local.gemm(device, options))
    if checkpoint_dir is not None and options.disk_check != "none":
        stage("checkpoint directory")
        first_on_host = hosts.index(host) == rank
        timed = options.disk_check == "all" or first_on_host
        parts.append(local.checkpoint_dir(checkpoint_dir, estimate, options, timed))
    for part in parts:
        failure = part.pop("failure", None)
        if failure:
            row["failures"].append(failure)
        row.update(part)
    return row


class _Run:
    """One call's state: its store keys, this rank and what it knows of the others."""

    def __init__(self, options: PreflightConfig, estimate: local.Estimate):
        self.options, self.estimate = options, estimate
        self.rank, self.world_size = pg.rank(), pg.world_size()
        self.store = dist.distributed_c10d._get_default_store() if pg.is_initialized() else None
        self.key = f"clorch/preflight/{next(_calls)}"
        self.start = time.monotonic()
        self.arrivals: dict[int, dict[str, Any]] = {}
        self.present = self.world_size  # ranks at the last meeting: those rank 0 waits for before leaving

    def stage(self, what: str) -> None:
        if self.store is not None:
            meeting.post(self.store, f"{self.key}/stage/{self.rank}", what)

    def missing_lines(self, missing: list[int], what: str) -> dict[int, str]:
        lines = {}
        for r in missing:
            last = meeting.read_if_posted(self.store, f"{self.key}/stage/{r}") if r != self.rank else None
            seen = f" (last seen at: {last})" if last else ""
            late = " (this rank: the others had given up on it)" if r == self.rank else ""
            lines[r] = f"{report.where(r, self.arrivals)} {what} within {self.options.timeout_s:g} s{seen}{late}"
        return lines

    def result(self, rows: dict[int, dict[str, Any]], missing: dict[int, str]) -> PreflightResult:
        return report.verdict(
            rows,
            missing,
            self.world_size,
            self.options.slow_ratio,
            self.estimate.to_dict(),
            self.options.to_dict(),
            time.monotonic() - self.start,
            {r: info["host"] for r, info in self.arrivals.items()},
            self.options.disk_slow_ratio,
        )


def _arrive(run: _Run, me: dict[str, Any]) -> list[int]:
    missing = meeting.meet(
        run.store, f"{run.key}/arrive", run.rank, run.world_size, json.dumps(me), run.options.timeout_s
    )
    present = [r for r in range(run.world_size) if r not in missing]
    run.present = len(present)
    run.arrivals = {r: json.loads(v) for r, v in meeting.values(run.store, f"{run.key}/arrive", present).items()}
    return missing


def _exchange(run: _Run, row: dict[str, Any]) -> PreflightResult:
    """Post this rank's row; rank 0 builds and posts the verdict; the others read it."""
    store, key, timeout = run.store, f"{run.key}/report", run.options.timeout_s
    missing = meeting.meet(store, key, run.rank, run.world_size, json.dumps(row), timeout)
    run.present = run.world_size - len(missing)
    lines = run.missing_lines(missing, "did not report its checks")
    if run.rank != 0 and 0 not in missing:
        posted = meeting.wait_posted(store, f"{run.key}/verdict", timeout)
        if posted is not None:
            return PreflightResult.from_dict(json.loads(posted))
        lines[0] = f"{report.where(0, run.arrivals)} did not post the verdict within {timeout:g} s"
    if run.rank != 0 or run.rank in missing:  # rank 0 is gone or late: what this rank knows
        return run.result({run.rank: row}, lines)
    present = [r for r in range(run.world_size) if r not in missing]
    rows = {r: json.loads(v) for r, v in meeting.values(store, key, present).items()}
    result = run.result(rows, lines)
    meeting.post(store, f"{run.key}/verdict", json.dumps(result.to_dict()))
    return result


def _preflight(run: _Run, run_dir: Path, checkpoint_dir: Path | None) -> PreflightResult:
    host = local.hostname()
    if run.store is None:  # one process, no group: its own checks only
        row = _local_row(0, [host], run.options, run.estimate, checkpoint_dir, run.stage)
        row.update(group_checks(None, 0, 1, pg.device(), run.options, run.stage))  # no peers: empty columns
        row.pop("failure")
        return run.result({0: row}, {})
    me = {"rank": run.rank, "host": host, "local_rank": pg.local_rank(), "local_world_size": pg.local_world_size()}
    missing = _arrive(run, me)
    if missing:
        return run.result({}, run.missing_lines(missing, "did not arrive"))
    hosts = [run.arrivals[r]["host"] for r in range(run.world_size)]
    groups, failure = None, None
    try:
        run.stage("making the preflight's process groups")
        groups = make_groups(hosts, pg.backend() or "gloo", run.options.timeout_s)
    except RuntimeError as exc:  # the backend could not connect the ranks in time
        failure = failure_line("making the preflight's process groups", exc)
    row = _local_row(run.rank, hosts, run.options, run.estimate, checkpoint_dir, run.stage)
    found = {"failure": failure}
    if failure is None:
        found = group_checks(groups, run.rank, run.world_size, pg.device(), run.options, run.stage)
    failure = found.pop("failure")
    if failure:
        row["failures"].append(failure)
    row.update(found)
    run.stage("reporting")
    return _exchange(run, row)


def run_preflight(
    options: PreflightConfig | Mapping[str, Any],
    *,
    run_dir: str | Path,
    checkpoint_dir: str | Path | None,
    model_params: int,
    bytes_per_param: float = 4,
    optimizer_states: float = 2,
    checkpoint_bytes: int | None = None,
    group: Any = None,
) -> PreflightResult:
    """Check this rank's machine and its links to the others; return the job's verdict.

    Every rank of the default process group must call it, at the same point
    (before training, after `init_process_group`); outside a group it checks
    this process alone. It blocks for at most about `options.timeout_s` per
    step (arrival, each collective, the exchange of results); a rank that does
    not arrive or report in time is named in `failures`, never waited on for
    longer. Rank 0 writes `run_dir/preflight.json`; every rank returns the
    verdict rank 0 built (or, when rank 0 is the one missing, what it knows).
    The caller decides what to print and whether to stop: the preflight does
    not raise for what it finds.

    Args:
        options: a `PreflightConfig`, or a mapping of its fields.
        run_dir: where rank 0 writes preflight.json (must exist).
        checkpoint_dir: where checkpoints will go (None: no checkpoint check).
        model_params: parameters of the model.
        bytes_per_param: bytes of one parameter (4: fp32 weights; 2: bf16).
        optimizer_states: parameter-sized optimizer buffers (Adam 2, SGD with momentum 1).
        checkpoint_bytes: expected checkpoint size; None: weights plus optimizer state.
        group: None or the default group (the preflight checks the whole job).

    Raises:
        ValueError, TypeError: a bad option or argument, raised on the rank that passed it
            before any communication.
    """
    options = _options(options)
    estimate = _estimate(model_params, bytes_per_param, optimizer_states, checkpoint_bytes)
    if group is not None and (not pg.is_initialized() or group is not dist.group.WORLD):
        raise ValueError(
            f"group must be None or the default group (the preflight checks every rank of the job), got {group!r}"
        )
    run = _Run(options, estimate)
    try:
        result = _preflight(run, Path(run_dir), None if checkpoint_dir is None else Path(checkpoint_dir))
    except meeting.StoreUnreachable as exc:
        result = run.result({}, {0: f"{report.where(0, run.arrivals)}: {exc}"})
    if run.rank == 0:
        write_json_atomic(Path(run_dir) / "preflight.json", result.to_dict(), indent=1)
    if run.store is not None:
        meeting.leave(run.store, run.key, run.rank, run.present, options.timeout_s)
    return result
