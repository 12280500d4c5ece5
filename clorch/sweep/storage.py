"""The Optuna sweeper's study: found or made in its storage, checked to be this sweep's,
its storage's failures said in one line.

Where the study lives:

    hydra.sweeper.storage unset   SWEEP_DIR/optuna.db (SQLite), study named after the sweep
                                  directory (its basename); a symbolic link there is refused:
                                  a sweep writes only inside its directory
    hydra.sweeper.storage=URL     that storage (several sweeps may share it); without
                                  `study_name`, the study is named after the sweep directory and
                                  a digest of its absolute path, so that projA/lr and projB/lr
                                  never continue each other's study

A study clorch makes carries the sweep's id (SWEEP_DIR/sweep.json, clorch.sweep.directory).
A study under the default name that carries another id (an optuna.db copied in from
another sweep) is refused; a study named with `study_name` is the user's to share.

A sweep directory's finished trials are results: a study that is missing (optuna.db
deleted, emptied, replaced) while the directory holds finished trial directories is
refused, naming them, rather than asked for new trials that would train into them.

A storage that fails (a damaged, locked or read-only file, a full disk, a URL no
driver can open) raises StorageError with one line that names it and what to do.
"""

from __future__ import annotations

import hashlib
import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import optuna
import sqlalchemy.exc

from clorch.sweep.directory import finished_trial_dirs
from clorch.sweep.errors import StorageError, SweepRefused
from clorch.sweep.heartbeat import UID_ATTR  # the study's too: the id of the sweep that made it
from clorch.sweep.settings import STUDY_FILE, OptunaSettings
from clorch.train.trial import make_pruner, open_storage


# (what the driver says, what it means and what to do), first match wins
_SQLITE_HINTS = (
    ("file is not a database", "is damaged (not an SQLite database): move it aside or restore it from a backup"),
    ("database disk image is malformed", "is damaged: move it aside or restore it from a backup"),
    ("database is locked", "stayed locked past 60 s: another process holds it; wait for it, or end it"),
    ("readonly database", "is read-only: make it (and its directory) writable, or choose another hydra.sweep.dir"),
    ("disk is full", "cannot grow: the disk is full; free space, then run the same command to continue"),
    ("disk i/o error", "cannot be read or written (a disk I/O error): check the disk"),
    ("unable to open database file", "cannot be opened: check that its directory exists and is writable"),
)


def explain(exc: BaseException, where: str) -> str | None:
    """One line for a storage failure `exc` of the storage `where`, or None (not a storage failure)."""
    if isinstance(exc, ImportError):
        return f"{where}: no driver for this storage is installed ({exc.__cause__ or exc}); install it, or drop storage"
    if isinstance(exc, (sqlalchemy.exc.ArgumentError, sqlalchemy.exc.NoSuchModuleError, ValueError)):
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"{where} cannot be opened: {first}; give an SQLAlchemy URL such as sqlite:///PATH"
    if isinstance(exc, (sqlalchemy.exc.SQLAlchemyError, sqlite3.Error, optuna.exceptions.StorageInternalError)):
        text = " ".join(str(e) for e in (exc, exc.__cause__, getattr(exc, "orig", None)) if e is not None).lower()
        for needle, hint in _SQLITE_HINTS:
            if needle in text:
                return f"{where} {hint}"
        first = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        return f"{where} failed: {first}"
    return None


@contextmanager
def storage_errors(where: str) -> Iterator[None]:
    """Within: a storage failure raises StorageError (one line, `where` named), nothing else changes."""
    try:
        yield
    except (SweepRefused, StorageError):
        raise
    except Exception as exc:
        message = explain(exc, where)
        if message is None:
            raise
        raise StorageError(message) from None


def study_file(sweep_dir: Path) -> Path:
    return sweep_dir / STUDY_FILE


def storage_url(settings: OptunaSettings, sweep_dir: Path) -> str:
    """The study's storage URL; a symbolic link where the default file belongs is refused."""
    if settings.storage:
        return settings.storage
    path = study_file(sweep_dir)
    if path.is_symlink():
        raise SweepRefused(
            [
                f"{path} is a symbolic link (to {path.readlink()}): a sweep writes only inside its directory; "
                "replace the link by the file itself, or choose another hydra.sweep.dir"
            ]
        )
    return f"sqlite:///{path.resolve()}"


def study_name(settings: OptunaSettings, sweep_dir: Path) -> str:
    """`study_name`, else the sweep directory's name (with a digest of its path in a shared storage)."""
    if settings.study_name:
        return settings.study_name
    if not settings.storage:
        return sweep_dir.name
    digest = hashlib.sha256(str(sweep_dir.resolve()).encode()).hexdigest()[:8]
    return f"{sweep_dir.name}-{digest}"


def where(settings: OptunaSettings, sweep_dir: Path) -> str:
    """How messages name the storage: its file, or hydra.sweeper.storage=URL."""
    return f"hydra.sweeper.storage={settings.storage}" if settings.storage else str(study_file(sweep_dir))


def open_study(settings: OptunaSettings, sweep_dir: Path, uid: str) -> tuple[Any, Any, str, str]:
    """(the study, its storage (an Optuna storage object), its URL, its name): this sweep's
    study, made when there is none.

    Raises:
        SweepRefused: the storage holds another sweep's study under this sweep's default name,
            or holds no study while the sweep directory holds finished trials.
        StorageError: the storage failed.
    """
    url, name = storage_url(settings, sweep_dir), study_name(settings, sweep_dir)
    label = where(settings, sweep_dir)
    with storage_errors(label):
        storage = open_storage(url)
        exists = name in optuna.get_all_study_names(storage) if _has_file(settings, sweep_dir) else False
        if not exists:
            _refuse_lost_study(sweep_dir, label, name)
        study = optuna.create_study(
            study_name=name,
            storage=storage,
            sampler=optuna.samplers.RandomSampler(),  # tells only: each trial is asked with its own sampler
            directions=settings.directions(),
            pruner=make_pruner(settings.pruning().name, settings.min_trials, settings.pruning().arguments()),
            load_if_exists=True,
        )
        _check_owner(study, settings, uid, label)
    return study, storage, url, name


def _has_file(settings: OptunaSettings, sweep_dir: Path) -> bool:
    """Whether the storage may hold the study (the default file exists and is not empty)."""
    if settings.storage:
        return True
    path = study_file(sweep_dir)
    return path.is_file() and path.stat().st_size > 0


def _refuse_lost_study(sweep_dir: Path, label: str, name: str) -> None:
    finished = finished_trial_dirs(sweep_dir)
    if finished:
        raise SweepRefused(
            [
                f"{label} holds no study {name!r}, but hydra.sweep.dir={sweep_dir} holds finished trial(s) "
                f"{', '.join(finished)}, which a new study would train over: restore the study (optuna.db), "
                "or choose another hydra.sweep.dir"
            ]
        )


def _check_owner(study: Any, settings: OptunaSettings, uid: str, label: str) -> None:
    """Mark a new study as this sweep's; refuse another sweep's study under the default name."""
    owner = study.user_attrs.get(UID_ATTR)
    if owner is None:
        study.set_user_attr(UID_ATTR, uid)
    elif owner != uid and not settings.study_name:
        raise SweepRefused(
            [
                f"{label} holds study {study.study_name!r} of another sweep (its id {owner}, this sweep's {uid}): "
                "it was copied or shared in from elsewhere; choose another hydra.sweep.dir, or name the study to "
                "share with hydra.sweeper.study_name"
            ]
        )
