"""What differs between two runs' environments (their env.json), for `clorch-runs verify`.

Compared: what decides the bits of a run's weights besides its config: Python, clorch
(its version and commit), torch, CUDA and NCCL, whether a GPU was used and which
models, the world size, your code's commit, and each data file's digest
(env.json's `data_files`, clorch.engine.data_files). Where the run's env.json does
not record a field (a run of an older clorch), the line says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# (env.json's key, what the line calls it), in the order they are listed.
_FIELDS = (
    ("torch", "torch"),
    ("cuda", "CUDA"),
    ("nccl", "NCCL"),
    ("cuda_available", "CUDA in use"),
    ("gpus", "GPU models"),
    ("clorch", "clorch version"),
    ("clorch_git_commit", "clorch commit"),
    ("git_commit", "your code's commit (where the run started)"),
    ("python", "Python"),
)
NOT_RECORDED = "not recorded"


@dataclass(frozen=True)
class Difference:
    """One thing that differs: what (a field or a data file's key), the run's value, the rerun's."""

    what: str
    run: Any
    rerun: Any

    def line(self) -> str:
        return f"{self.what}: {_shown(self.run)} (run) -> {_shown(self.rerun)} (rerun)"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def differences(run_env: dict[str, Any], rerun_env: dict[str, Any]) -> list[Difference]:
    """Every recorded difference: the fields above, the world size, then the data files."""
    found = []
    for key, what in _FIELDS:
        before, after = run_env.get(key, NOT_RECORDED), rerun_env.get(key, NOT_RECORDED)
        if before != after:
            found.append(Difference(what, before, after))
    sizes = [_plan(env).get("world_size", NOT_RECORDED) for env in (run_env, rerun_env)]
    if sizes[0] != sizes[1]:
        found.append(Difference("world size", *sizes))
    return found + data_differences(run_env, rerun_env)


def data_differences(run_env: dict[str, Any], rerun_env: dict[str, Any]) -> list[Difference]:
    """The data files whose digest (or path) differs, or that only one of the two recorded."""
    before, after = _data(run_env), _data(rerun_env)
    if before is None:
        return [Difference("data files' digests", NOT_RECORDED, "recorded" if after else NOT_RECORDED)]
    after = after or {}
    found = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key) or {}, after.get(key) or {}
        path = new.get("path") or old.get("path") or "?"
        if old.get("path") != new.get("path"):
            found.append(Difference(f"{key} (data file)", old.get("path", "none"), new.get("path", "none")))
        elif old.get("sha256") != new.get("sha256"):
            found.append(Difference(f"{key} {path} (data file changed)", _sha(old), _sha(new)))
    return found


def _data(env: dict[str, Any]) -> dict[str, Any] | None:
    value = env.get("data_files")
    return value if isinstance(value, dict) else None


def _plan(env: dict[str, Any]) -> dict[str, Any]:
    return env["plan"] if isinstance(env.get("plan"), dict) else {}


def _sha(entry: dict[str, Any]) -> str:
    digest, size = entry.get("sha256"), entry.get("bytes")
    if not isinstance(digest, str):
        return entry.get("error") or "unreadable"
    return f"sha256 {digest[:16]}..., {size} bytes" if isinstance(size, int) else f"sha256 {digest[:16]}..."


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return str(value) if value is not None else "none"
