"""Reading one run directory, tolerantly: what can be told from the files that are there.

A run directory (outputs/DATE/TIME, multirun/DATE/TIME/N, or a `run_local`
directory) holds some of: env.json, config.yaml, metrics.jsonl, summary.json,
logs/job.json, .hydra/overrides.yaml, checkpoints/. A run still going, one whose
`clorch-train` was killed, or one that lost its summary lacks some of them, and
any file may be cut short: every reader here returns what it can and notes what
it could not read, and never raises for a run's content. Nothing here writes.
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
import os
import socket
from pathlib import Path
from typing import Any

import yaml

from clorch.launch.procs import pid_alive
from clorch.launch.job import FINAL_STATES
from clorch.status import Status

# The files whose presence makes a directory a run directory.
MARKERS = ("env.json", "summary.json", "config.yaml", "metrics.jsonl", "logs/job.json")
# What a sweep directory holds besides its numbered trials.
SWEEP_MARKERS = ("multirun.yaml", "sweep_summary.csv", "sweep_summary.md")
# Every status a listed run can have: summary.json's, the launcher's, and those told from files.
STATUSES = tuple(s.value for s in Status if s not in (Status.NOT_STARTED, Status.MISSING))


def short_id(run_dir: str | os.PathLike) -> str:
    """An 8-hex-digit id derived from the run directory's absolute path (stable while it stays put)."""
    return hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:8]


def is_run_dir(path: Path) -> bool:
    return any((path / marker).is_file() for marker in MARKERS)


def is_sweep_dir(path: Path) -> bool:
    return any((path / marker).is_file() for marker in SWEEP_MARKERS)


class Run:
    """One run directory as read now. Files are read on first use; nothing is written.

    Attributes:
        path: the run directory (absolute).
        problems: one line per file that exists but could not be read.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).resolve()
        self.problems: list[str] = []

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, status={self.status!r})"

    # -- files ---------------------------------------------------------------
    def _json(self, name: str) -> dict[str, Any]:
        path = self.path / name
        if not path.is_file():
            return {}
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            self.problems.append(f"{name} cannot be read ({type(exc).__name__}: {exc})")
            return {}
        if not isinstance(data, dict):
            self.problems.append(f"{name} holds a {type(data).__name__}, not an object")
            return {}
        return data

    @functools.cached_property
    def summary(self) -> dict[str, Any]:
        """summary.json ({} when missing or unreadable)."""
        return self._json("summary.json")

    @functools.cached_property
    def env(self) -> dict[str, Any]:
        """env.json: versions, host, commits, command line ({} when missing or unreadable)."""
        return self._json("env.json")

    @functools.cached_property
    def job(self) -> dict[str, Any]:
        """logs/job.json, the launcher's record (clorch's launcher only)."""
        return self._json("logs/job.json")

    @functools.cached_property
    def config(self) -> dict[str, Any]:
        """config.yaml, the resolved config ({} when missing or unreadable)."""
        data = self._yaml("config.yaml")
        return data if isinstance(data, dict) else {}

    @functools.cached_property
    def raw_overrides(self) -> list[str]:
        """The overrides Hydra recorded for this run (.hydra/overrides.yaml), as given."""
        data = self._yaml(".hydra/overrides.yaml")
        return [str(item) for item in data] if isinstance(data, list) else []

    def _yaml(self, name: str) -> Any:
        path = self.path / name
        if not path.is_file():
            return None
        try:
            return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except (OSError, yaml.YAMLError) as exc:
            self.problems.append(f"{name} cannot be read ({type(exc).__name__})")
            return None

    @functools.cached_property
    def metrics(self) -> list[dict[str, Any]]:
        """metrics.jsonl's records; a line cut short (a killed run) or not JSON is skipped."""
        path = self.path / "metrics.jsonl"
        records = []
        try:
            lines = path.read_text().splitlines() if path.is_file() else []
        except OSError as exc:
            self.problems.append(f"metrics.jsonl cannot be read ({exc})")
            return []
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line) if line.strip() else None
            except ValueError:
                self.problems.append(f"metrics.jsonl line {number} is not JSON (skipped)")
                continue
            if isinstance(record, dict):
                records.append(record)
        return records

    # -- what it is --------------------------------------------------------------
    @property
    def id(self) -> str:
        """summary.json's run_id when it records one, else `short_id` of the directory."""
        recorded = self.summary.get("run_id")
        return recorded if isinstance(recorded, str) and recorded else short_id(self.path)

    @property
    def sweep(self) -> Path | None:
        """The sweep directory when this run is one of a sweep's trials (multirun/DATE/TIME/N)."""
        parent = self.path.parent
        return parent if self.path.name.isdigit() and is_sweep_dir(parent) else None

    @functools.cached_property
    def status(self) -> str:
        """summary.json's status; without one, what the launcher's record and its pid tell:
        'running' (the launcher lives), 'killed' (it died without recording the end), the
        launcher's own final state, or 'unknown'."""
        recorded = self.summary.get("status")
        if isinstance(recorded, str) and recorded:
            return recorded
        state = (self.job.get("status") or {}).get("state") if isinstance(self.job.get("status"), dict) else None
        if state in FINAL_STATES:  # the launcher's, as job.json records them
            return state  # the job ended and recorded it; only the summary was not written
        if state != Status.RUNNING:
            return Status.UNKNOWN.value
        pid, host = self.job.get("launcher_pid"), self.job.get("host")
        if host != socket.gethostname() or not isinstance(pid, int):
            return Status.UNKNOWN.value  # a pid means nothing on another host
        # Imported here, for runs without a summary only: clorch.launch costs the listing ~0.1 s.

        if pid_alive(pid):
            return Status.RUNNING.value
        return (Status.STOPPED if (self.path / "logs" / "stop.request").exists() else Status.KILLED).value

    @property
    def recipe(self) -> str | None:
        for item in self.raw_overrides:
            key, sep, value = item.partition("=")
            if sep and key.lstrip("+~") == "recipe":
                return value
        return None

    @property
    def overrides(self) -> list[str]:
        """The overrides given, recipe aside, as `key=value` (Hydra's `+`/`++` prefixes dropped)."""
        out = []
        for item in self.raw_overrides:
            key, sep, value = item.partition("=")
            if key.lstrip("+~") != "recipe":
                out.append(f"{key.lstrip('+')}={value}" if sep else item)
        return out

    @property
    def start(self) -> _dt.datetime | None:
        """When the run started: env.json's time, else the launcher's, else the directory's name."""
        try:
            if isinstance(self.env.get("time"), str):
                return _dt.datetime.fromisoformat(self.env["time"])
            if isinstance(self.job.get("created_at"), (int, float)):
                return _dt.datetime.fromtimestamp(self.job["created_at"]).replace(microsecond=0)
        except (ValueError, OverflowError, OSError):
            pass
        for path in (self.path, self.path.parent):  # outputs/DATE/TIME, multirun/DATE/TIME/N
            try:  # TIME, or TIME-N for runs that started in the same second
                return _dt.datetime.strptime(f"{path.parent.name} {path.name[:8]}", "%Y-%m-%d %H-%M-%S")
            except ValueError:
                continue
        return None

    # -- results ---------------------------------------------------------------
    @property
    def steps(self) -> int | None:
        if isinstance(self.summary.get("steps"), int):
            return self.summary["steps"]
        steps = [r["step"] for r in self.metrics if isinstance(r.get("step"), int)]
        return max(steps) if steps else None

    @property
    def planned_steps(self) -> int | None:
        planned = self.summary.get("planned_steps")
        if planned is None:
            planned = (
                (self.env.get("plan") or {}).get("total_steps") if isinstance(self.env.get("plan"), dict) else None
            )
        return planned if isinstance(planned, int) else None

    @property
    def final(self) -> dict[str, Any]:
        """The last metrics: summary.json's `final`, else the last train and eval records."""
        if isinstance(self.summary.get("final"), dict) and self.summary["final"]:
            return self.summary["final"]
        final: dict[str, Any] = {}
        for kind in ("eval", "train"):  # the train record's step wins, as in summary.json
            records = [r for r in self.metrics if r.get("kind") == kind]
            if records:
                final.update({k: v for k, v in records[-1].items() if k != "kind"})
        return final

    @property
    def best(self) -> dict[str, Any]:
        """The eval record with the lowest eval_loss: summary.json's `best`, else from metrics.jsonl."""
        if isinstance(self.summary.get("best"), dict) and self.summary["best"]:
            return self.summary["best"]
        evals = [r for r in self.metrics if r.get("kind") == "eval" and _number(r.get("eval_loss"))]
        best = min(evals, key=lambda r: r["eval_loss"]) if evals else {}
        return {k: v for k, v in best.items() if k != "kind"}

    @property
    def wall_time_s(self) -> float | None:
        value = self.summary.get("wall_time_s")
        return value if _number(value) else None

    @property
    def world_size(self) -> int | None:
        for source in (
            self.summary,
            self.env.get("plan") if isinstance(self.env.get("plan"), dict) else {},
            self.job.get("config") if isinstance(self.job.get("config"), dict) else {},
        ):
            if isinstance(source.get("world_size"), int):
                return source["world_size"]
        return None

    @property
    def commit(self) -> str | None:
        """The commit of the checkout the run was started from (env.json's git_commit)."""
        value = self.env.get("git_commit")
        return value if isinstance(value, str) else None

    @property
    def clorch_commit(self) -> str | None:
        value = self.env.get("clorch_git_commit")
        return value if isinstance(value, str) else None

    def record(self) -> dict[str, Any]:
        """Everything `clorch-runs ls --json` shows of the run (plain JSON values)."""
        start = self.start
        return {
            "id": self.id,
            "dir": str(self.path),
            "start": start.isoformat() if start else None,
            "recipe": self.recipe,
            "overrides": self.overrides,
            "status": self.status,
            "steps": self.steps,
            "planned_steps": self.planned_steps,
            "final": self.final,
            "best": self.best,
            "wall_time_s": self.wall_time_s,
            "world_size": self.world_size,
            "commit": self.commit,
            "clorch_commit": self.clorch_commit,
            "host": self.env.get("host"),
            "sweep": str(self.sweep) if self.sweep else None,
            "problems": list(self.problems),
        }


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
