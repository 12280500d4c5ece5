"""Picking and ordering runs: `--where KEY OP VALUE`, --status, --recipe, --since, --sort.

A KEY is one of `FIELDS` (what a row shows), a metric of the run's last
records (`eval_loss`, or `final.eval_loss`), of its best eval (`best.eval_loss`
or `best_eval_loss`), or a config key (`optim.lr`, `ddp.bucket_cap_mb`).
"""

from __future__ import annotations

import datetime as _dt
import re
from typing import Any, Iterable, Sequence

from clorch.runs.discover import UsageError
from clorch.runs.records import STATUSES, Run
from clorch.status import Status

FIELDS = (
    "id",
    "dir",
    "start",
    "recipe",
    "overrides",
    "status",
    "steps",
    "planned_steps",
    "wall_time_s",
    "world_size",
    "commit",
    "host",
    "sweep",
)
OPERATORS = ("<=", ">=", "==", "!=", "<", ">", "=")
# KEY OP VALUE; the value may not start with an operator's character, so `a<<1` is refused.
_WHERE = re.compile(r"\s*([A-Za-z_][\w.\-/]*)\s*(<=|>=|==|!=|<|>|=)\s*([^\s<>=!].*?)\s*")
_WORDS = {"true": True, "false": False, "null": None, "none": None}


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"optim.lr": 0.003, ...}: a nested config's leaves under dotted keys (lists are leaves)."""
    if not isinstance(tree, dict):
        return {prefix: tree} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return {k.rstrip("."): v for k, v in out.items()}


def value_of(run: Run, key: str) -> Any:
    """The run's value for `key` (see the module docstring), None where it has none."""
    if key in FIELDS:
        record = run.record()
        value = record[key]
        return " ".join(value) if key == "overrides" else value
    for prefix, source in (("final.", run.final), ("best.", run.best), ("best_", run.best)):
        if key.startswith(prefix) and key[len(prefix) :] in source:
            return source[key[len(prefix) :]]
    if key in run.final:
        return run.final[key]
    return flatten(run.config).get(key)


def known_keys(runs: Iterable[Run]) -> set[str]:
    keys = set(FIELDS)
    for run in runs:
        keys.update(
            run.final,
            (f"final.{k}" for k in run.final),
            (f"best.{k}" for k in run.best),
            (f"best_{k}" for k in run.best),
            flatten(run.config),
        )
    return keys


def _check_key(option: str, text: str, key: str, runs: Sequence[Run]) -> None:
    if runs and key not in known_keys(runs):
        raise UsageError(
            f"{option} {text!r}: unknown key {key!r}; allowed: {', '.join(FIELDS)}, a metric "
            "(eval_loss, final.loss, best.eval_loss or best_eval_loss) or a config key "
            "(optim.lr) that some listed run has"
        )


def parse_value(text: str) -> Any:
    """`0.1` -> 0.1, `true` -> True, `null` -> None, `'a b'` -> "a b", anything else as written."""
    if text.lower() in _WORDS:
        return _WORDS[text.lower()]
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text.strip("'\"")


class Condition:
    """One `KEY OP VALUE` of --where."""

    def __init__(self, text: str, runs: Sequence[Run] = ()):
        match = _WHERE.fullmatch(text)
        if not match:
            raise UsageError(
                f"--where {text!r}: expected KEY OP VALUE such as 'eval_loss<0.1' or "
                f"'optim.lr==3e-4', with OP one of {', '.join(OPERATORS)}"
            )
        self.text, (self.key, self.op, raw) = text, match.groups()
        self.value = parse_value(raw)
        _check_key("--where", text, self.key, runs)

    def __call__(self, run: Run) -> bool:
        actual, wanted = value_of(run, self.key), self.value
        if actual is None or wanted is None:
            same = actual is None and wanted is None
            return same if self.op in ("=", "==") else (not same if self.op == "!=" else False)
        if not (_is_number(actual) and _is_number(wanted)):
            actual, wanted = str(actual), str(wanted)  # ISO times and names compare as text
        if self.op in ("=", "=="):
            return actual == wanted
        if self.op == "!=":
            return actual != wanted
        return {"<": actual < wanted, "<=": actual <= wanted, ">": actual > wanted, ">=": actual >= wanted}[self.op]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_since(text: str) -> _dt.datetime:
    try:
        return _dt.datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"--since {text!r}: expected a date or time such as 2026-12-01 or 2026-12-01T14:30") from None


def split_list(values: Iterable[str] | None) -> list[str]:
    """`--status failed,killed --status running` -> ["failed", "killed", "running"]."""
    return [v.strip() for value in values or () for v in value.split(",") if v.strip()]


def pick(
    runs: Sequence[Run],
    where: Sequence[str] = (),
    statuses: Sequence[str] = (),
    recipes: Sequence[str] = (),
    since: str | None = None,
) -> list[Run]:
    """The runs that meet every condition given.

    Raises:
        UsageError: a malformed --where, an unknown key or status, a bad --since.
    """
    conditions = [Condition(text, runs) for text in where]
    for status in statuses:
        if status not in STATUSES:
            raise UsageError(f"--status {status!r}: not a run status; allowed: {', '.join(STATUSES)}")
    start = parse_since(since) if since else None
    out = []
    for run in runs:
        if statuses and not _has_status(run, statuses):
            continue
        if recipes and run.recipe not in recipes:
            continue
        if start is not None and (run.start is None or run.start < start):
            continue
        if all(condition(run) for condition in conditions):
            out.append(run)
    return out


def _has_status(run: Run, statuses: Sequence[str]) -> bool:
    """`run` has one of `statuses`; "failed" takes in every status that counts as a failure
    (clorch.status.Status.failed: a failed preflight, a stopped or killed run, ...)."""
    if run.status in statuses:
        return True
    return Status.FAILED in statuses and Status.of(run.status).failed and run.status != Status.UNKNOWN


def sort_runs(runs: Sequence[Run], key: str) -> list[Run]:
    """`runs` ordered by `key` (a leading `-`: descending); runs without a value come last."""
    descending, name = key.startswith("-"), key.lstrip("-")
    _check_key("--sort", key, name, runs)
    present = [(value_of(r, name), r) for r in runs]
    missing = [r for v, r in present if v is None]
    valued = [(v, r) for v, r in present if v is not None]
    valued.sort(
        key=lambda pair: (not _is_number(pair[0]), pair[0] if _is_number(pair[0]) else str(pair[0])), reverse=descending
    )
    return [r for _, r in valued] + missing
