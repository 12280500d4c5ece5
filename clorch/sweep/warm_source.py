"""The sweep that `hydra.sweeper.warm_start=PATH` names, checked without Optuna before any trial.

A warm start reads another sweep of the Optuna sweeper: a directory that holds its
sweep.json (clorch.sweep.directory), whose study it finds there (its name, and its
storage: SWEEP_DIR/optuna.db or the URL the sweep was given). Its trials' results count
in this sweep's study only where they answer the same question, so the source must
search with the same objective and direction, and must not be this sweep's own
directory. Its searched space is compared with this sweep's once its study is read
(clorch.sweep.warm_start), also before the first trial. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clorch.sweep.directory import IDENTITY_FILE, SweepIdentity
from clorch.sweep.errors import SweepRefused
from clorch.sweep.objectives import as_list
from clorch.sweep.settings import STUDY_FILE


@dataclass
class WarmSource:
    """The sweep a warm start reads: its directory (absolute) and what its sweep.json records."""

    sweep_dir: Path
    identity: SweepIdentity

    def storage_url(self) -> str:
        """Its study's storage: the URL it was given, else its own SQLite file."""
        return self.identity.study.get("storage") or f"sqlite:///{self.sweep_dir / STUDY_FILE}"

    def study_name(self) -> str:
        return str(self.identity.study.get("name"))


def _key(value: Any) -> str:
    return f"hydra.sweeper.warm_start={value}"


def read_source(value: str, objective: Any, direction: Any) -> tuple[WarmSource | None, list[str]]:
    """(the sweep directory `value` names, every reason it cannot warm start a sweep of `objective`
    and `direction`): it must be a directory of the Optuna sweeper, searching for the same."""
    path = Path(value).expanduser()
    allowed = "the hydra.sweep.dir of an earlier hydra/sweeper=optuna sweep"
    if not path.is_dir():
        return None, [f"{_key(value)} is not a directory; a warm start takes {allowed}"]
    try:
        identity = SweepIdentity.read(path)
    except SweepRefused:
        identity = None
    what = _not_optuna(identity)
    if what:
        return None, [f"{_key(value)} is not a clorch Optuna sweep directory (it holds {what}); give {allowed}"]
    errors = [
        f"{_key(value)} searched for {name} {as_list(there)}, this sweep for {as_list(here)}: a warm start's "
        f"results must answer the same question; set hydra.sweeper.{name} as that sweep did, or drop warm_start"
        for name, there, here in (
            ("objective", identity.objective, objective),
            ("direction", identity.direction, direction),
        )
        if as_list(there) != as_list(here)
    ]
    return WarmSource(path.resolve(), identity), errors


def _not_optuna(identity: SweepIdentity | None) -> str | None:
    """What a directory holds instead of a sweep of the Optuna sweeper, or None."""
    if identity is None:
        return f"no {IDENTITY_FILE} that clorch wrote"
    if identity.sweeper != "optuna":
        return f"a sweep of hydra/sweeper={identity.sweeper}, which has no study"
    if not identity.study.get("name"):
        return f"a {IDENTITY_FILE} without its study's name, written by an older clorch"
    return None


def own_directory_error(source: WarmSource, sweep_dir: Path, uid: str | None = None) -> str | None:
    """Why `source` is this sweep itself (the same directory, or a copy of it: its id), or None."""
    same = sweep_dir.exists() and source.sweep_dir.samefile(sweep_dir)
    if not same and not (uid and source.identity.uid == uid):
        return None
    return (
        f"{_key(source.sweep_dir)} is this sweep's own directory (hydra.sweep.dir={sweep_dir}): its trials are "
        "this study's already; give another sweep's directory, or drop warm_start"
    )


def source_errors(value: Any, objective: Any, direction: Any, sweep_dir: str | None) -> list[str]:
    """Every error of `hydra.sweeper.warm_start` found from the directories alone (the command line's check)."""
    if not isinstance(value, str) or not value:
        return []  # its type: clorch.sweep.settings
    source, errors = read_source(value, objective, direction)
    if source is not None and sweep_dir is not None:
        errors += [e for e in [own_directory_error(source, Path(sweep_dir))] if e]
    return errors
