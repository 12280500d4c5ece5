"""save_checkpoint / load_checkpoint / verify_checkpoint: rank-zero, atomic, verified.

On disk, a checkpoint at `path` is two files in `path`'s directory:

    path                          metadata (JSON): the commit point
    <path name>.<token>.tensors   tensor archive (torch zip), named by the metadata

Saving first refuses a `path` that holds anything but a clorch checkpoint (it
is never overwritten). It then writes the archive under a fresh random name
and fsyncs it, writes the metadata to a hidden temporary (`.<path
name>.<token>.tmp`) and fsyncs it, then renames the temporary onto `path`
(atomic) and fsyncs the directory. Only then is the archive of the checkpoint
it replaced deleted. Both new files are created exclusively (O_EXCL), so a
symlink planted at their names is never followed. Killed at any moment, or out
of disk space, `path` holds the previous complete checkpoint or the new one,
never a mix; a leftover `.tensors` or `.tmp` file is named by no metadata and
never loaded.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import warnings
from pathlib import Path
from typing import Any

import torch

from clorch._version import __version__
from clorch._files import created_files
from clorch.checkpoint import archive, metadata
from clorch.checkpoint.atomic import commit, file_kind, remove_quietly, write_durable
from clorch.checkpoint.collective import agree, exchange
from clorch.checkpoint.restore import detach_from_file, model_mismatches, optimizer_mismatches
from clorch.checkpoint.errors import CheckpointError, WorldSizeChangedWarning
from clorch.checkpoint.locks import path_lock
from clorch.checkpoint.rng import capture_rng, restore_rng
import clorch.distributed as cdist
from clorch.nn.parallel.ddp import unwrap_model

# errno values meaning the filesystem has no room for the checkpoint (EDQUOT: over quota).
_NO_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def _check_stateful(name: str, obj: Any) -> None:
    if obj is not None and not (
        callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))
    ):
        raise TypeError(f"{name} must have state_dict() and load_state_dict() methods, got {type(obj).__name__}")


def _check_path(path: Any) -> Path:
    if not isinstance(path, (str, Path)):
        raise TypeError(f"path must be a str or pathlib.Path, got {type(path).__name__}")
    return Path(path)


def _local_save_state(model, optimizer, sampler, scaler, state) -> tuple[dict, dict]:
    if model is None:
        raise TypeError("model is required (an nn.Module or anything with state_dict/load_state_dict)")
    for name, obj in (("model", model), ("optimizer", optimizer), ("sampler", sampler), ("scaler", scaler)):
        _check_stateful(name, obj)
    state = {} if state is None else state
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict (or None), got {type(state).__name__}")
    metadata.check_json_state(state)
    sampler_state = sampler.state_dict() if sampler is not None else None
    metadata.check_json_state(sampler_state, "sampler.state_dict()")
    return state, {"sampler": sampler_state, "rng": capture_rng()}


def _remove_superseded(path: Path, keep_archive: str) -> None:
    """Delete archives and temporaries of earlier (or crashed) saves to this same path."""
    for old in created_files(path.parent, f"{path.name}.", ".tensors"):
        if old.name != keep_archive:
            remove_quietly(old)
    for tmp in created_files(path.parent, f".{path.name}.", ".tmp"):
        remove_quietly(tmp)


def _drop_cached(path: Path) -> None:
    """Ask the kernel to drop the cached pages of the archives this save will supersede.

    They stay on disk, intact, until the new checkpoint is committed. Their
    cached pages are only in the way: a new archive written while the old one
    still fills the page cache was written at a third of the speed on a small
    machine (the kernel reclaiming and throttling writers), which made saving
    2x slower than `torch.save` there, which truncates its file first. Linux
    only; elsewhere, and on any error, nothing happens.
    """
    if not hasattr(os, "posix_fadvise"):
        return
    for old in created_files(path.parent, f"{path.name}.", ".tensors"):
        try:  # never follow a symlink, never wait on a FIFO
            fd = os.open(old, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass
        finally:
            os.close(fd)


def _check_replaceable(path: Path) -> None:
    """Refuse to save over anything at `path` but a clorch checkpoint (or a dangling symlink).

    Checked before anything is written. Another process could still put a
    file there before the commit; this guards against a wrong `path`
    (a dataset, a torch.save file), not against a concurrent writer.

    Raises:
        CheckpointError: `path` is not a regular file, or not clorch checkpoint metadata.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise CheckpointError(
            f"save_checkpoint would overwrite {path}, which is {file_kind(mode)}, "
            "not a clorch checkpoint: nothing was written; pass another path"
        )
    if not metadata.is_checkpoint(path):
        raise CheckpointError(
            f"save_checkpoint would overwrite {path}, which is not a clorch checkpoint "
            "(it cannot be parsed as clorch checkpoint metadata): nothing was written; "
            "delete it yourself or pass another path"
        )


def _tensor_bytes(value: Any) -> int:
    """Bytes of the tensors in a (nested) state dict: about the size of their archive."""
    if isinstance(value, torch.Tensor):
        return value.nelement() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(item) for item in value)
    return 0


def _disk_full(path: Path, needed: int, exc: OSError) -> CheckpointError:
    """The error for a save that ran out of space (measured after its partial files were removed)."""
    try:
        free = f"{shutil.disk_usage(path.parent).free} bytes are free"
    except OSError as usage_error:
        free = f"the free space is unknown ({usage_error})"
    return CheckpointError(
        f"not enough disk space to save checkpoint {path}: it needs about {needed} bytes and {free} "
        f"in {path.parent} ({exc.strerror or exc}); the partial files were removed and whatever was at "
        f"{path} is unchanged"
    )


def _write_files(path: Path, tensors: dict, state: dict, per_rank: list[dict]) -> Path:
    """Archive, metadata, commit; a failure before the commit leaves no new file. Returns the archive."""
    archive_file, info = archive.write_archive(path.parent, f"{path.name}.", tensors)
    try:
        body = metadata.new_body(
            versions={"clorch_version": __version__, "torch_version": torch.__version__},
            world_size=len(per_rank),
            state=state,
            archive={"file": archive_file.name, **info},
            contents={name: name in tensors for name in ("model", "optimizer", "scaler")},
            samplers=[r["sampler"] for r in per_rank],
            rng=[r["rng"] for r in per_rank],
        )
        temporary = write_durable(path.parent, f".{path.name}.", ".tmp", metadata.encode(body))
    except BaseException:
        remove_quietly(archive_file)
        raise
    try:
        commit(temporary, path)
    except BaseException:
        # A temporary that is gone was renamed onto `path` (only a directory fsync failed):
        # the committed metadata names this archive, which must then stay.
        if remove_quietly(temporary):
            remove_quietly(archive_file)
        raise
    return archive_file


def _write(path: Path, model, optimizer, scaler, state: dict, per_rank: list[dict]) -> None:
    """Rank 0's part of save_checkpoint: check the path, write and commit, clean up."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {"model": model.state_dict()}
    if optimizer is not None:
        tensors["optimizer"] = optimizer.state_dict()
    if scaler is not None:
        tensors["scaler"] = scaler.state_dict()
    # Another process saving to the same path waits here: its cleanup must not delete the
    # archive this save's metadata names (nor this one's, its).
    with path_lock(path):
        _check_replaceable(path)
        _drop_cached(path)
        try:
            archive_file = _write_files(path, tensors, state, per_rank)
        except OSError as exc:
            if exc.errno in _NO_SPACE:
                raise _disk_full(path, _tensor_bytes(tensors), exc) from exc
            raise
        _remove_superseded(path, archive_file.name)


def save_checkpoint(
    path: str | Path,
    *,
    model: Any,
    optimizer: Any = None,
    sampler: Any = None,
    scaler: Any = None,
    state: dict[str, Any] | None = None,
) -> Path:
    """Save model, optimizer, scaler, every rank's sampler and RNG states, and `state`, atomically.

    Collective: every rank of the process group must call it (without a group,
    it is an ordinary local save). All ranks first exchange their sampler and
    RNG states (a blocking all-gather); rank 0 then writes the checkpoint while
    the others wait for its outcome (a second all-gather, the barrier), so
    when it returns on any rank the checkpoint is committed and durable.
    Model, optimizer, scaler and `state` are taken from rank 0.

    Args:
        path: the checkpoint's metadata file (its directory is created).
        model: an nn.Module, a DDP wrapper, or anything with state_dict().
        optimizer, scaler: optional; anything with state_dict()/load_state_dict().
        sampler: optional clorch.data.DistributedSampler (each rank's is saved).
        state: JSON-serializable training state (epoch, step...), returned by
            load_checkpoint; tuples come back as lists.

    Returns:
        The committed path.

    Raises:
        TypeError: an argument without state_dict, or a `state` JSON cannot hold
            (on every rank: a rank that failed the check re-raises its own error,
            the others raise CheckpointError naming it).
        CheckpointError: `path` holds something other than a clorch checkpoint
            (nothing is written), or the disk is full (the message gives the bytes
            needed and free; the partial files are removed, `path` is unchanged).
        OSError: rank 0 could not write (re-raised on rank 0; CheckpointError on the others).
        RuntimeError: the process group failed: a peer died, did not call
            save_checkpoint (only rank 0 did), or was busy past the group's
            timeout; the message says that every rank must call it.
        CollectiveMismatchError: debug mode (CLORCH_DEBUG_COLLECTIVES=1) only: a
            peer called another clorch collective instead (at once, on every rank).
    """
    error, gathered_local = None, None
    try:
        path = _check_path(path)
        model = unwrap_model(model)  # the model's own keys, loadable without a DDP wrapper
        state, gathered_local = _local_save_state(model, optimizer, sampler, scaler, state)
    except Exception as exc:  # shared with the other ranks before any of them raises
        error = exc
    per_rank = exchange(gathered_local, error, f"prepare checkpoint {path}")
    error = None
    if cdist.rank() == 0:
        try:
            _write(path, model, optimizer, scaler, state, per_rank)
        except Exception as exc:
            error = exc
    agree(error, f"write checkpoint {path} (rank 0 writes)")
    return path


def _read(path: Path) -> tuple[dict[str, Any], Any]:
    body = metadata.read(path)
    tensors = archive.read_archive(metadata.archive_path(path, body), body["archive"], path)
    if not isinstance(tensors, dict) or not isinstance(tensors.get("model"), dict):
        raise CheckpointError(f"checkpoint archive of {path} has no 'model' state dict")
    return body, tensors


def verify_checkpoint(path: str | Path) -> dict[str, Any]:
    """Check a checkpoint completely without changing anything; return its metadata.

    Reads the metadata (JSON, checksummed), checks the archive's size and every
    block's digest (XXH3-128), and opens it with torch.load(weights_only=True). Local: not
    collective, any rank may call it.

    Raises:
        FileNotFoundError: no metadata file at `path`.
        CheckpointError: corrupt, truncated or malformed metadata or archive, a
            missing archive, a path that is not a regular file (a FIFO, a
            directory: refused at once, never read), or an archive that is not a
            plain tensor archive.
    """
    body, _ = _read(_check_path(path))
    return body


def _check_fit(path: Path, body: dict, tensors: dict, model, optimizer, sampler, scaler) -> None:
    problems = model_mismatches(model.state_dict(), tensors["model"])
    if problems:
        raise ValueError(f"checkpoint {path} does not fit the model: " + "; ".join(problems))
    for name, obj in (("optimizer", optimizer), ("scaler", scaler)):
        if obj is not None and name not in tensors:
            raise ValueError(
                f"{name} was given, but checkpoint {path} holds no {name} state "
                f"(it holds {sorted(tensors)}): pass {name}=None"
            )
    if optimizer is not None:
        problems = optimizer_mismatches(optimizer, tensors["optimizer"])
        if problems:
            raise ValueError(f"checkpoint {path} does not fit the optimizer: " + "; ".join(problems))
    rank, world_size = cdist.rank(), cdist.world_size()
    if sampler is not None:
        saved = body["samplers"]
        if body["world_size"] != world_size:
            raise ValueError(
                f"sampler was given, but checkpoint {path} was saved by world_size "
                f"{body['world_size']} and this job has {world_size}"
            )
        if saved[rank] is None:
            raise ValueError(f"sampler was given, but checkpoint {path} holds no sampler state for rank {rank}")
        problem = sampler.state_problem(saved[rank]) if callable(getattr(sampler, "state_problem", None)) else None
        if problem is not None:  # a state no sampler of this kind writes: the metadata is corrupt
            raise CheckpointError(f"checkpoint metadata {path} is corrupt: field 'samplers[{rank}]' {problem}")
        if callable(getattr(sampler, "check_state_dict", None)):
            sampler.check_state_dict(saved[rank])


def _apply(body: dict, tensors: dict, model, optimizer, sampler, scaler) -> None:
    model.load_state_dict(tensors["model"])  # copies out of the archive's mapping
    if optimizer is not None:
        optimizer.load_state_dict(detach_from_file(tensors["optimizer"]))
    if scaler is not None:
        scaler.load_state_dict(detach_from_file(tensors["scaler"]))
    rank = cdist.rank()
    if sampler is not None:
        sampler.load_state_dict(body["samplers"][rank])
    if body["world_size"] == cdist.world_size():
        restore_rng(body["rng"][rank])  # last: nothing above may consume random numbers after it
    else:
        warnings.warn(
            f"checkpoint was saved by world_size {body['world_size']}, this job has "
            f"{cdist.world_size()}: RNG states not restored",
            WorldSizeChangedWarning,
            stacklevel=3,
        )


def load_checkpoint(
    path: str | Path, *, model: Any, optimizer: Any = None, sampler: Any = None, scaler: Any = None
) -> dict[str, Any]:
    """Restore what save_checkpoint saved, on every rank; return the training `state`.

    Collective: every rank of the process group must call it (without a group,
    it is local). Each rank reads and verifies the files itself (a shared
    filesystem, or one host), checks that they fit its model, optimizer,
    sampler and scaler, then all ranks agree (a blocking all-gather) before
    any of them changes anything: a load is all or nothing, on every rank.
    Each rank then restores the model, optimizer, scaler, its own sampler
    state and its own RNG states (CPU, numpy, Python, CUDA where captured).

    Raises:
        FileNotFoundError: nothing at `path` (on the rank that saw it; the
            others raise CheckpointError naming that rank).
        CheckpointError: a corrupt, truncated, malformed, missing or unsafe file,
            or a path that is not a regular file.
        ValueError: missing, unexpected or mis-shaped model/optimizer keys (all
            listed), a component the checkpoint lacks, or sampler state saved
            with another dataset_size, num_replicas, rank or seed.
        TypeError: an argument without state_dict/load_state_dict.
        RuntimeError: the process group failed, or a peer did not call
            load_checkpoint (as with save_checkpoint).
        CollectiveMismatchError: debug mode only, as with save_checkpoint.
    """
    error, body, tensors = None, None, None
    try:
        path = _check_path(path)
        for name, obj in (("model", model), ("optimizer", optimizer), ("sampler", sampler), ("scaler", scaler)):
            _check_stateful(name, obj)
        if model is None:
            raise TypeError("model is required (an nn.Module or anything with state_dict/load_state_dict)")
        model = unwrap_model(model)
        body, tensors = _read(path)
        _check_fit(path, body, tensors, model, optimizer, sampler, scaler)
    except Exception as exc:
        error = exc
    agree(error, f"read checkpoint {path}", "load_checkpoint")
    try:
        _apply(body, tensors, model, optimizer, sampler, scaler)
    except Exception as exc:
        error = exc
    del tensors  # drop the archive's mapping
    agree(error, f"restore checkpoint {path}", "load_checkpoint")
    return body["state"]
