"""Sharded checkpoints: every rank writes its own shards through torch.distributed.checkpoint (DCP).

    from clorch.checkpoint.sharded import save_sharded, load_sharded

    save_sharded(path, model=model, optimizer=optimizer, sampler=sampler, state={"step": step})
    state = load_sharded(path, model=model, optimizer=optimizer, sampler=sampler)

The model may be sharded (`clorch.nn.parallel.fsdp.shard_model`), wrapped in
DDP (clorch's or torch's), or plain: the format is the same (DCP's, keyed by
the model's own parameter names), and DCP reshards on load, so a checkpoint
saved on W ranks loads on any number of ranks, sharded or not.

On disk, a checkpoint at `path` is a directory:

    path/.metadata, path/__<rank>_0.distcp   DCP's index and each rank's shards
    path/clorch.json                         clorch's part: model signature, step
                                             state, sampler position, RNG per rank

Atomic like `save_checkpoint`: all ranks write into a hidden temporary
directory beside it (`.<name>.<token>.tmp`; DCP fsyncs each file), rank 0
then writes `clorch.json` last (fsynced) and commits the directory with one
rename, fsyncing the parent before and after. A kill -9 at any moment leaves
the previous checkpoints as they were and at most a hidden temporary that no
`step_*.dcp` name matches, so `latest_sharded_checkpoint` never takes it. A
directory without `clorch.json` is refused as incomplete. Saving over an
existing sharded checkpoint at the same path moves it aside first
(`.<name>.<token>.old`, deleted after the commit): a kill between those two
renames leaves the old one there, under its hidden name, not at `path`;
step checkpoints have a path of their own and never meet this. A save that
fails (a full disk, a dead rank) leaves its temporary behind; the next
`prune_sharded_checkpoints` deletes it once a newer step is committed.

Collectives: `save_sharded` and `load_sharded` are collective over the default
process group (every rank calls them, in the same order; without a group they
are local). A rank that fails makes every rank raise (`clorch.checkpoint.collective`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict, set_state_dict

import clorch.distributed as cdist
from clorch._files import unique_token
from clorch._version import __version__
from clorch.checkpoint.atomic import commit, fsync_dir, write_durable
from clorch.checkpoint.collective import agree, exchange
from clorch.checkpoint.dcp_read import (
    SafeLoadPlanner,
    VerifiedReader,
    as_checkpoint_error,
    check_byte_items,
    read_metadata_file,
)
from clorch.checkpoint.errors import CheckpointError, WorldSizeChangedWarning
from clorch.checkpoint.policy import Latest, newest_verified
from clorch.checkpoint.sharded_files import file_entry, files_of, my_share, verify_files
from clorch.checkpoint.sharded_marker import FORMAT, MARKER, encode_marker, read_marker
from clorch.checkpoint.rank_buffers import RANK_BUFFERS, buffer_digests, differing, empty_copies, own_copies
from clorch.checkpoint.rng import capture_rng, restore_rng
from clorch.nn.parallel.ddp import unwrap_model

__all__ = [
    "MARKER",
    "WorldSizeChangedWarning",
    "find_latest_sharded",
    "latest_sharded_checkpoint",
    "load_sharded",
    "prune_sharded_checkpoints",
    "save_sharded",
    "sharded_step_path",
    "verify_sharded",
]


_STEP_DIR = re.compile(r"step_(\d{8,})\.dcp")


def sharded_step_path(directory: str | Path, step: int) -> Path:
    """`directory / "step_00000100.dcp"` for step 100 (zero-padded so names sort by step)."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    return Path(directory) / f"step_{step:08d}.dcp"


@contextlib.contextmanager
def _one_process_is_intended() -> Iterator[None]:
    """Outside a process group DCP saves and loads in one process, as meant here: no warning for it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _model_signature(model_state: dict[str, Any]) -> dict[str, list]:
    """Parameter name -> [global shape, dtype]: what must match for a checkpoint to fit a model."""
    return {
        name: [list(value.shape), str(value.dtype).removeprefix("torch.")]
        for name, value in model_state.items()
        if isinstance(value, torch.Tensor)
    }


def _signature_problems(saved: dict[str, list], mine: dict[str, list]) -> list[str]:
    problems = []
    missing, unexpected = sorted(set(mine) - set(saved)), sorted(set(saved) - set(mine))
    if missing:
        problems.append(f"parameters the checkpoint lacks: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    if unexpected:
        problems.append(f"parameters this model lacks: {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}")
    differ = [
        f"{n}: saved {saved[n][0]} {saved[n][1]}, model {mine[n][0]} {mine[n][1]}"
        for n in sorted(set(saved) & set(mine))
        if saved[n] != mine[n]
    ]
    if differ:
        problems.append("shapes or dtypes differ: " + "; ".join(differ[:8]))
    return problems


def _local_info(model, sampler) -> dict[str, Any]:
    sampler_state = sampler.global_state_dict() if sampler is not None else None
    model_state = get_model_state_dict(model)
    return {
        "sampler": sampler_state,
        "rng": capture_rng(),
        "signature": _model_signature(model_state),
        "buffers": buffer_digests(model_state),
    }


def _check_replaceable(path: Path) -> None:
    if path.exists() and not (path.is_dir() and (path / MARKER).is_file()):
        raise CheckpointError(
            f"save_sharded would replace {path}, which is not a clorch sharded checkpoint: "
            "nothing was written; pass another path"
        )


def _prepare(path: Path, per_rank: list[dict]) -> Path:
    """Rank 0: check the ranks agree and the path may be written; make the temporary directory."""
    samplers = [r["sampler"] for r in per_rank]
    if any(s != samplers[0] for s in samplers):
        raise CheckpointError(
            f"the ranks' samplers are at different positions ({samplers}); ranks must "
            "consume batches in step for a global position to exist"
        )
    _check_replaceable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.parent / f".{path.name}.{unique_token()}.tmp"
    temporary.mkdir()
    return temporary


def _commit(temporary: Path, path: Path, body: dict[str, Any]) -> None:
    """Rank 0: write the marker last, then put the directory at `path` with one rename."""
    fsync_dir(temporary)  # DCP's files are fsynced; their directory entries now too
    marker = write_durable(temporary, f".{MARKER}.", ".tmp", encode_marker(body))
    commit(marker, temporary / MARKER)
    aside = None
    if path.exists():
        aside = path.parent / f".{path.name}.{unique_token()}.old"
        os.replace(path, aside)
    commit(temporary, path)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def _hash_my_share(temporary: Path) -> dict[str, Any]:
    """This rank's share of the digests of the files DCP wrote into `temporary`."""
    names = my_share(files_of(temporary, MARKER), cdist.rank(), cdist.world_size())
    return {name: file_entry(temporary / name) for name in names}


def _merged_files(temporary: Path, shares: list[dict[str, Any]]) -> dict[str, Any]:
    """Rank 0: every rank's digests in one record, which must cover the files rank 0 sees."""
    files = {name: entry for share in shares for name, entry in share.items()}
    if sorted(files) != files_of(temporary, MARKER):
        raise CheckpointError(
            f"the ranks saw different files in {temporary} ({sorted(files)} against rank 0's "
            f"{files_of(temporary, MARKER)}): is it on a filesystem every rank shares?"
        )
    return files


def save_sharded(
    path: str | Path, *, model: Any, optimizer: Any = None, sampler: Any = None, state: dict[str, Any] | None = None
) -> Path:
    """Save model and optimizer shards from every rank, plus sampler, RNG and `state`, atomically.

    Collective: every rank calls it. Four blocking steps: an all-gather of each
    rank's sampler position, RNG state and model signature (and rank 0's temporary
    directory), DCP's own collective save, an all-gather of the digests of DCP's
    files (each rank hashes its share of them), and a final agreement after rank 0's
    commit; when it returns on any rank the checkpoint is committed and durable.

    Args:
        path: the checkpoint directory to create (e.g. `sharded_step_path(dir, step)`).
        model: a sharded, DDP-wrapped or plain nn.Module.
        optimizer: optional torch optimizer over the model's parameters.
        sampler: optional `clorch.data.DistributedSampler`; its global position is saved.
        state: JSON-serializable training state (step, epoch ...), returned by `load_sharded`.

    Raises:
        TypeError: `state` is not a JSON-serializable dict (on every rank).
        CheckpointError: `path` holds something else than a sharded checkpoint, or the
            samplers' positions differ between ranks; nothing is committed.
        RuntimeError: the process group failed or a rank did not call it.
    """
    path, model = Path(path), unwrap_model(model)
    state = {} if state is None else state
    info, error = _checked_local_info(model, sampler, state)
    per_rank = exchange(info, error, f"prepare sharded checkpoint {path}", "save_sharded")
    error, temporary = None, None
    if cdist.rank() == 0:
        try:
            temporary = _prepare(path, per_rank)
        except Exception as exc:
            error = exc
    temporary = Path(exchange(str(temporary), error, f"create {path}'s temporary", "save_sharded")[0])
    own = differing([r["buffers"] for r in per_rank])
    _write_shards(temporary, model, optimizer, own)
    error, share = None, None
    try:
        share = _hash_my_share(temporary)
    except (OSError, CheckpointError) as exc:
        error = exc
    shares = exchange(share, error, f"hash the files of {path}", "save_sharded")
    error = None
    if cdist.rank() == 0:
        try:
            body = _body(state, per_rank, optimizer is not None, own)
            _commit(temporary, path, {**body, "files": _merged_files(temporary, shares)})
        except Exception as exc:
            error = exc
    agree(error, f"commit sharded checkpoint {path} (rank 0 renames)", "save_sharded")
    return path


def _checked_local_info(model: Any, sampler: Any, state: Any) -> tuple[dict[str, Any] | None, Exception | None]:
    """This rank's part of the checkpoint's clorch.json (`_local_info`), or the error that `state`
    is not a JSON-serializable dict (raised on every rank after the exchange)."""
    try:
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict (or None), got {type(state).__name__}")
        json.dumps(state)
        return _local_info(model, sampler), None
    except (TypeError, ValueError) as exc:  # json.dumps: TypeError, or ValueError for a cycle
        return None, exc


def _write_shards(temporary: Path, model: Any, optimizer: Any, own: Any) -> None:
    """DCP's collective save of model and optimizer state (and each rank's own buffers) into `temporary`."""
    model_state, optim_state = get_state_dict(model, [optimizer] if optimizer is not None else [])
    with _one_process_is_intended():
        dcp.save(
            {"model": model_state, "optim": optim_state, **own_copies(model_state, own, cdist.rank())},
            checkpoint_id=temporary,
            no_dist=not cdist.is_initialized(),
        )


def _body(state: dict[str, Any], per_rank: list[dict], has_optimizer: bool, own: Any) -> dict[str, Any]:
    """clorch.json's fields but the files' digests: versions, world size, state, model signature,
    the sampler's position, each rank's RNG states and the buffers that differ by rank."""
    return {
        "format": FORMAT,
        "clorch_version": __version__,
        "torch_version": torch.__version__,
        "world_size": len(per_rank),
        "state": state,
        "has_optimizer": has_optimizer,
        "signature": per_rank[0]["signature"],
        "sampler": per_rank[0]["sampler"],
        "rng": [r["rng"] for r in per_rank],
        "rank_buffers": own,
    }


def _check_fit(path: Path, body: dict, model, optimizer) -> None:
    problems = _signature_problems(body["signature"], _model_signature(get_model_state_dict(model)))
    if problems:
        raise CheckpointError(f"sharded checkpoint {path} holds another model: " + "; ".join(problems))
    if optimizer is not None and not body["has_optimizer"]:
        raise CheckpointError(
            f"optimizer was given, but sharded checkpoint {path} holds no optimizer state: pass optimizer=None"
        )


def _verified(path: Path, model: Any, optimizer: Any, sampler: Any) -> tuple[dict[str, Any], Any]:
    """clorch.json and DCP's `.metadata`, read after this rank's share of the files verified, and
    checked against the model, optimizer and sampler. Raises what `load_sharded` says it raises."""
    body = read_marker(path)
    _check_fit(path, body, model, optimizer)
    verify_files(path, body["files"], MARKER, cdist.rank(), cdist.world_size())
    metadata = read_metadata_file(path, body["files"], path / MARKER)
    check_byte_items(path, metadata)
    if sampler is not None:
        if body["sampler"] is None:
            raise CheckpointError(f"sampler was given, but sharded checkpoint {path} holds no sampler state")
        sampler.check_global_state_dict(body["sampler"])
    return body, metadata


def load_sharded(path: str | Path, *, model: Any, optimizer: Any = None, sampler: Any = None) -> dict[str, Any]:
    """Restore a sharded checkpoint onto this job's ranks, whatever world size saved it.

    Collective: every rank calls it. Each rank reads `clorch.json` and checks the
    model (names, global shapes, dtypes) and optimizer against it, verifies its share
    of DCP's files against their recorded digests (`clorch.checkpoint.sharded_files`),
    and reads DCP's `.metadata` and byte items without running code from them
    (`clorch.checkpoint.dcp_read`); the ranks agree (blocking) before anything changes;
    DCP then reads each rank's shards (resharding as needed), the sampler continues the
    saved global position on this world size, and RNG states are restored per rank
    when the world size is the saved one (a `WorldSizeChangedWarning` otherwise:
    random streams cannot be re-split; the data order can).

    Returns:
        The `state` dict given to `save_sharded`.

    Raises:
        FileNotFoundError: nothing at `path`.
        CheckpointError: an incomplete directory, a missing, extra, truncated or changed
            file, a `.metadata` or byte item that names anything but plain values (each named),
            another model (missing, unexpected or mis-shaped parameters, listed), or an
            optimizer the checkpoint lacks.
        ValueError: a sampler of another dataset, seed, shuffle or drop_last.
        RuntimeError: the process group failed or a rank did not call it.
    """
    path, model = Path(path), unwrap_model(model)
    error, body, metadata = None, None, None
    try:
        body, metadata = _verified(path, model, optimizer, sampler)
    except Exception as exc:
        error = exc
    agree(error, f"read sharded checkpoint {path}", "load_sharded")
    if sampler is not None:
        sampler.load_global_state_dict(body["sampler"])
    optimizers = [optimizer] if optimizer is not None else []
    model_state, optim_state = get_state_dict(model, optimizers)
    same_world = body["world_size"] == cdist.world_size()
    own = empty_copies(model_state, body["rank_buffers"] if same_world else [], cdist.rank())
    loaded = {"model": model_state, "optim": optim_state, **own}
    reader = VerifiedReader(path, metadata)
    try:
        with _one_process_is_intended():
            dcp.load(loaded, storage_reader=reader, planner=SafeLoadPlanner(reader), no_dist=not cdist.is_initialized())
    except CheckpointException as exc:  # a BaseException: one CheckpointError instead, as every load raises
        raise as_checkpoint_error(exc, path) from None
    for copies in own.get(RANK_BUFFERS, {}).values():
        loaded["model"].update(copies)  # this rank's own buffers, not the copy DCP kept of one rank's
    set_state_dict(model, optimizers, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
    if same_world:
        restore_rng(body["rng"][cdist.rank()])
    else:
        warnings.warn(
            f"sharded checkpoint {path} was saved by world_size {body['world_size']}, this job has "
            f"{cdist.world_size()}: RNG states not restored (dropout and augmentation draw other "
            "numbers than the uninterrupted run; the data order is exact)",
            WorldSizeChangedWarning,
            stacklevel=2,
        )
    return body["state"]


def verify_sharded(path: str | Path) -> dict[str, Any]:
    """Check a sharded checkpoint completely, changing nothing; return its clorch.json. Local.

    Its marker, every file's digest (a missing or unrecorded file too), DCP's `.metadata`
    and byte items read without running code from them. Not collective: one rank hashes
    every file (`load_sharded` splits the work over the ranks).

    Raises:
        FileNotFoundError: nothing at `path`.
        CheckpointError: what `load_sharded` refuses for the files, naming the file.
    """
    path = Path(path)
    body = read_marker(path)
    verify_files(path, body["files"], MARKER)
    check_byte_items(path, read_metadata_file(path, body["files"], path / MARKER))
    return body


def find_latest_sharded(directory: str | Path) -> Latest:
    """The newest `step_*.dcp` in `directory` that `verify_sharded` accepts, and the newer ones
    skipped with why (a directory without clorch.json among them). Local, not collective."""
    directory = Path(directory)
    if not directory.is_dir():
        return Latest(None, [])
    found = sorted(
        ((int(m.group(1)), p) for p in directory.iterdir() if (m := _STEP_DIR.fullmatch(p.name))), reverse=True
    )
    return newest_verified((path for _, path in found), verify_sharded)


def latest_sharded_checkpoint(directory: str | Path) -> Path | None:
    """The newest `step_*.dcp` in `directory` that verifies completely, or None. Local, not collective.

    A newer one that is incomplete, damaged or unsafe is skipped with a warning naming it and why.
    """
    latest = find_latest_sharded(directory)
    for path, reason in latest.skipped:
        warnings.warn(f"skipping sharded checkpoint {path}: {reason}", stacklevel=2)
    return latest.path


def prune_sharded_checkpoints(directory: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` step checkpoints and old temporaries; rank 0 only.

    Not collective (other ranks return []). Call it after `save_sharded` returned.
    """
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
        raise ValueError(f"keep_last must be an int >= 1, got {keep_last!r}")
    if cdist.rank() != 0:
        return []
    directory = Path(directory)
    found = sorted(
        ((int(m.group(1)), p) for p in directory.iterdir() if (m := _STEP_DIR.fullmatch(p.name))), reverse=True
    )
    removed = [p for _, p in found[keep_last:]]
    newest = found[0][0] if found else None
    for leftover in directory.glob(".step_*.dcp.*"):
        match = re.fullmatch(r"\.step_(\d{8,})\.dcp\..+\.(tmp|old)", leftover.name)
        if match and newest is not None and int(match.group(1)) < newest:
            removed.append(leftover)
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed
