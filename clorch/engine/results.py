"""The records of a run, typed: what a rank returns, how the launcher says the job ended,
summary.json, and what `execute` (and `clorch.run_local`) returns.

    RankResult   a rank's worker's result (rank 0's figures; a preflight verdict)
    JobEnd       the launcher's final status (clorch.launch's dict, read once, here)
    NodeResult   what a node's local rank 0 leaves its launching process (launcher=torchrun)
    RunSummary   summary.json (its keys as they always were; `from_dict` reads older files)
    RunResult    execute()'s result (indexable as the dict earlier versions returned)

Each status is a clorch.status.Status, which owns the exit code and the console line.
Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from clorch.plan.plan import Plan
from clorch.status import Status


def _known(cls: type, record: Mapping[str, Any] | None) -> dict[str, Any]:
    """The fields of dataclass `cls` that `record` holds (a record from a file, a worker or
    the launcher may lack some, or hold more)."""
    if not isinstance(record, Mapping):
        return {}
    return {f.name: record[f.name] for f in dataclasses.fields(cls) if f.name in record}


def _build(cls: type, record: Mapping[str, Any] | None, **convert: Any) -> Any:
    """An instance of dataclass `cls` from the fields `record` holds, each passed through
    `convert[field]` when given (a nested record becomes its dataclass)."""
    known = _known(cls, record)
    return cls(**{name: convert[name](value) if name in convert else value for name, value in known.items()})


def _or_empty(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


@dataclass
class JobError:
    """The first failure of a job, as the launcher records it (clorch.launch's `error`)."""

    rank: int | None = None
    type: str | None = None
    message: str | None = None
    traceback: str | None = None
    exit_code: int | None = None
    signal: str | None = None

    @classmethod
    def from_dict(cls, record: Mapping[str, Any] | None) -> "JobError | None":
        return cls(**_known(cls, record)) if isinstance(record, Mapping) else None

    def describe(self, failed: str = "failed") -> str:
        """`rank R failed: Type: message` (or what is known of it), for one line of the console."""
        who = f"rank {self.rank} {failed}: " if self.rank is not None else ""
        what = ": ".join(str(x) for x in (self.type, self.message) if x) or "no error recorded"
        return who + what


def describe_error(error: Mapping[str, Any] | JobError | None, failed: str = "failed") -> str:
    """`rank R failed: Type: message` of a launcher's error record, for one line of the console."""
    found = error if isinstance(error, JobError) else JobError.from_dict(error)
    return (found or JobError()).describe(failed)


@dataclass
class PreflightVerdict:
    """The preflight's figures in summary.json (clorch.train.preflight.summary_of)."""

    passed: bool = False
    failures: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    ranks: list[Any] = field(default_factory=list)
    estimate: dict[str, Any] = field(default_factory=dict)
    table: str = ""

    @classmethod
    def from_dict(cls, record: Mapping[str, Any] | None) -> "PreflightVerdict | None":
        return cls(**_known(cls, record)) if isinstance(record, Mapping) else None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class RankResult:
    """What a rank's worker returns (clorch.train.worker.train): rank 0's figures of the run;
    on the other ranks of an outside launcher's job, the job's preflight verdict alone."""

    steps: int | None = None
    epoch: int | None = None
    resumed_from: str | None = None
    resumed_run_dir: str | None = None
    train_time_s: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    final_eval: dict[str, float] = field(default_factory=dict)
    weights_sha256: str | None = None
    preflight: PreflightVerdict | None = None
    exported: str | None = None
    pruned_at: int | None = None  # a sweep's pruner stopped the trial at this step's eval
    paused_at: int | None = None  # a sweep's ASHA pruner paused the trial at this step (its checkpoint's)

    @classmethod
    def from_dict(cls, record: Mapping[str, Any] | None) -> "RankResult":
        """A worker's dict ({} or None from a worker that returns nothing)."""
        return _build(cls, record, preflight=PreflightVerdict.from_dict, final_eval=_or_empty)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class JobEnd:
    """How the launcher says the job ended (clorch.launch's final status, or what the
    launching process knows under launcher=torchrun), with rank 0's result when it has it."""

    state: Status = Status.UNKNOWN  # a launcher record without one says nothing of how it ended
    results: list[RankResult] = field(default_factory=list)
    exit_codes: list[int | None] | None = None
    failed_rank: int | None = None
    error: JobError | None = None
    attempts: int = 1
    restart_count: int = 0
    interrupted_by: str | None = None  # the signal's name
    ranks: list[int] | None = None
    attempt_errors: list[JobError | None] = field(default_factory=list)  # each attempt's failure
    raw: dict[str, Any] = field(default_factory=dict)  # the launcher's own record, as it gave it

    @classmethod
    def from_launcher(cls, status: Mapping[str, Any], **changes: Any) -> "JobEnd":
        """From clorch.launch's status dict (its keys: see clorch.launch.launcher.Job.status),
        with `changes` (as `state=Status.INTERRUPTED, interrupted_by="SIGINT"`) over it."""
        raw = {**status, **{k: str(v) if isinstance(v, Status) else v for k, v in changes.items()}}
        end = _build(
            cls,
            {**raw, "raw": raw},
            state=Status.of,
            results=_rank_results,
            error=JobError.from_dict,
            restart_count=lambda n: n or 0,
            attempt_errors=list,
        )
        attempts = _build(_Attempts, raw).attempts  # the launcher's list: counted, and each failure
        end.attempts, end.attempt_errors = _attempt_count(attempts), _attempt_errors(attempts)
        return end

    @property
    def rank0(self) -> RankResult:
        return self.results[0] if self.results else RankResult()


def _rank_results(results: Any) -> list[RankResult]:
    return [RankResult.from_dict(r) for r in results or [] if isinstance(r, Mapping)]


def _attempt_count(attempts: Any) -> int:
    """The launcher's attempts (a list, one entry per attempt), counted; 1 when it kept none."""
    return len(attempts) if isinstance(attempts, list) and attempts else 1


@dataclass
class _Attempts:
    """The launcher's record of its attempts: one entry each ({"error": ..., ...})."""

    attempts: Any = None
    error: Any = None


def _attempt_errors(attempts: Any) -> list[JobError | None]:
    return [
        JobError.from_dict(_build(_Attempts, a).error) if isinstance(a, Mapping) else None
        for a in (attempts if isinstance(attempts, list) else [])
    ]


@dataclass
class NodeResult:
    """What a node's local rank 0 leaves, under launcher=torchrun, for the process whose agent
    started it (clorch.engine.as_rank.main): rank 0's result when rank 0 ran on that node, and
    the job's preflight verdict, which every rank knows."""

    rank0: bool = False  # rank 0 ran on this node: its launching process writes summary.json
    result: RankResult | None = None
    preflight: PreflightVerdict | None = None
    restarts: int = 0

    @classmethod
    def from_dict(cls, record: Mapping[str, Any] | None) -> "NodeResult":
        return _build(
            cls,
            record,
            result=RankResult.from_dict,
            preflight=PreflightVerdict.from_dict,
            restarts=lambda n: int(n or 0),
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# summary.json's keys written only when they say something (as before the records were typed).
_OPTIONAL = ("interrupted_by", "preflight", "launcher", "errors", "pruned_at", "paused_at")


@dataclass
class RunSummary:
    """summary.json: status, final and best metrics, steps, wall time, throughput."""

    status: Status
    exit_codes: list[int | None] | None = None
    failed_rank: int | None = None
    error: JobError | None = None
    steps: int | None = None
    planned_steps: int | None = None
    final: dict[str, Any] = field(default_factory=dict)
    best: dict[str, Any] = field(default_factory=dict)
    wall_time_s: float | None = None
    train_time_s: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    weights_sha256: str | None = None
    resumed_from: str | None = None
    world_size: int | None = None
    backend: str | None = None
    attempts: int = 1
    trusted_modules: dict[str, list[str]] = field(default_factory=dict)
    exported: str | None = None
    interrupted_by: str | None = None
    preflight: PreflightVerdict | None = None
    launcher: str | None = None  # an outside launcher's name, or torchrun for launcher=torchrun
    errors: list[str] | None = None  # a sweep's job that config errors stopped
    pruned_at: int | None = None  # a sweep's trial its pruner stopped: the step of that eval
    paused_at: int | None = None  # a sweep's trial ASHA paused: the step of that eval and of its checkpoint

    @classmethod
    def config_error(cls, errors: list[str]) -> "RunSummary":
        """A sweep's job that config errors stopped: its directory keeps the reason."""
        return cls(status=Status.CONFIG_ERROR, errors=list(errors))

    @classmethod
    def from_dict(cls, record: Mapping[str, Any] | None) -> "RunSummary":
        """summary.json's content, from any version of clorch (a key it lacks takes its default)."""
        return _build(
            cls,
            {"status": None, **(record if isinstance(record, Mapping) else {})},
            status=Status.of,
            error=JobError.from_dict,
            preflight=PreflightVerdict.from_dict,
            final=_or_empty,
            best=_or_empty,
            trusted_modules=_or_empty,
        )

    def to_dict(self) -> dict[str, Any]:
        """summary.json's content (the keys it always had; the optional ones when set)."""
        if self.status is Status.CONFIG_ERROR and self.errors is not None:
            return {"status": str(self.status), "errors": list(self.errors)}
        out = {**dataclasses.asdict(self), **dict(status=str(self.status))}
        for name in _OPTIONAL:
            if out[name] is None:
                del out[name]
        return out


def step_of(final: Mapping[str, Any]) -> int:
    """The step of the last metrics record (0 when none was written)."""
    return int(_build(_Step, final).step or 0)


@dataclass
class _Step:
    step: int | None = None


def last_step(summary: RunSummary) -> int:
    """The step the run's last metrics record was written at (0: none was)."""
    return step_of(summary.final)


@dataclass
class RunResult:
    """What `execute` (and `clorch.run_local`) returns: how the job ended, its summary, where.

    Indexing it by the keys of the dict earlier versions returned still works
    (`result["status"]["state"]`, `result["summary"]["steps"]`): "status" is the
    launcher's own record, "summary" summary.json's content.
    """

    job: JobEnd
    summary: RunSummary
    run_dir: str
    plan: Plan
    logs: dict[int, dict[str, str]] = field(default_factory=dict)
    preflight: PreflightVerdict | None = None  # the job's verdict, on a node without rank 0 too

    @property
    def status(self) -> Status:
        return self.summary.status

    def __getitem__(self, key: str) -> Any:
        legacy = {
            "status": self.job.raw,
            "summary": self.summary.to_dict(),
            "logs": self.logs,
            "run_dir": self.run_dir,
            "plan": self.plan,
        }
        return legacy[key]
