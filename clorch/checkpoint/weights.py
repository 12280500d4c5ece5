"""Model weights and a model: check they fit, load them, export them.

The weights are read by clorch.checkpoint.weights_files (re-exported here: `read_weights`,
`open_weights`, `weight_names`). Tensors a model shares under two names (a language
model's output matrix tied to its token embedding) need only one of them in the file,
as Hugging Face saves them.

`fit_errors` compares names and shapes only, so it works on a model built on
the `meta` device, before any process starts; `load_weights` then copies the
weights into a real model, or tensor by tensor into a sharded one.
`save_safetensors` exports a model's weights.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import safetensors.torch
import torch
from torch.distributed.tensor import DTensor

from clorch._files import create_exclusive
from clorch.checkpoint import atomic
from clorch.checkpoint.weights_files import (  # noqa: F401 (re-exported: the weights API is one module)
    KINDS,
    WeightsFileNotFoundError,
    as_path,
    open_weights,
    read_weights,
    short_list,
    weight_names,
)
from clorch.nn.parallel.ddp import unwrap_model
from clorch.nn.parallel.fsdp_init import fill_shard

_NOT_STRICT = "model.init_strict=false (strict=False in Python)"


def _is_sharded(module: torch.nn.Module) -> bool:
    return any(isinstance(p, DTensor) for p in module.parameters())


def _shape_errors(key: str, expected: Mapping[str, Any], weights: Mapping[str, Any]) -> list[str]:
    not_tensors = [
        f"{name} ({type(value).__name__})" for name, value in weights.items() if not isinstance(value, torch.Tensor)
    ]
    shapes = [
        f"{name} (file {tuple(value.shape)}, model {tuple(expected[name].shape)})"
        for name, value in weights.items()
        if name in expected
        and isinstance(value, torch.Tensor)
        and isinstance(expected[name], torch.Tensor)
        and value.shape != expected[name].shape
    ]
    errors = []
    if not_tensors:
        errors.append(f"{key}: {len(not_tensors)} value(s) in the file are not tensors: {short_list(not_tensors)}")
    if shapes:
        errors.append(
            f"{key}: {len(shapes)} tensor(s) have another shape in the file than in the model: {short_list(shapes)}"
        )
    return errors


def _tied(module: torch.nn.Module) -> dict[str, list[str]]:
    """{name: the module's other names for the same tensor}: a parameter or buffer shared under
    two names, as a language model's output matrix tied to its token embedding is (Hugging Face's
    save_pretrained then writes it once, `lm_head.weight` left out)."""
    named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    groups: dict[int, list[str]] = {}
    for name, tensor in named:
        groups.setdefault(id(tensor), []).append(name)
    return {name: [o for o in group if o != name] for group in groups.values() if len(group) > 1 for name in group}


def _with_tied(module: torch.nn.Module, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`weights` with each tensor the module shares under another name given under that name too."""
    filled = dict(weights)
    for name, others in _tied(module).items():
        source = next((o for o in others if o in weights), None)
        if name not in filled and source is not None:
            filled[name] = weights[source]
    return filled


def fit_errors(
    model: torch.nn.Module, weights: Mapping[str, torch.Tensor], strict: bool = True, key: str = "model.init_from"
) -> list[str]:
    """Why `weights` would not load into `model`, one message per kind of problem (none: it fits).

    Only names and shapes are compared, so `model` may be on the `meta`
    device. As with torch's `load_state_dict`, `strict=False` ignores missing
    and unexpected keys; shape mismatches are reported either way, and so is a
    file that shares no key with the model (a non-strict load of it would
    load nothing). A tensor the model holds under two names (tied) needs one
    of them in the file. Each message starts with `key`, lists up to five names and
    says how many there are; none names the file (the caller knows it).

    Args:
        model: the model to load into (a DDP wrapper is looked through).
        weights: a state dict, e.g. from `read_weights`.
        strict: whether every model key must be in `weights` and every key of
            `weights` in the model.
        key: the config key the messages start with.

    Raises:
        TypeError: `model` is not an nn.Module, or `weights` not a mapping.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(weights, Mapping):
        raise TypeError(f"weights must be a mapping of names to tensors, got {type(weights).__name__}")
    module = unwrap_model(model)
    expected, tied = module.state_dict(), _tied(module)
    missing = [name for name in expected if name not in weights and not any(o in weights for o in tied.get(name, ()))]
    unexpected = [str(name) for name in weights if name not in expected]
    errors = []
    shared = len(expected) > len(missing)  # a non-strict load would load something
    if strict and missing:
        errors.append(
            f"{key}: {len(missing)} key(s) of the model are missing from the file: {short_list(missing)}"
            + (f"; {_NOT_STRICT} loads the file's keys and keeps the model's own values for these" if shared else "")
        )
    if strict and unexpected:
        errors.append(
            f"{key}: {len(unexpected)} key(s) in the file are not in the model: {short_list(unexpected)}"
            + (f"; {_NOT_STRICT} leaves them out" if shared else "")
        )
    if not strict and expected and len(missing) == len(expected):
        errors.append(
            f"{key}: none of the file's {len(weights)} key(s) is a key of the model, so a "
            f"non-strict load would load nothing: the file has {short_list(unexpected) or 'no keys'}; "
            f"the model has {short_list(missing)}"
        )
    return errors + _shape_errors(key, expected, weights)


def load_weights(
    model: torch.nn.Module, path: str | os.PathLike, strict: bool = True, key: str = "model.init_from"
) -> None:
    """Copy the weights in `path` into `model`, in place, all or nothing.

    Local: not collective; each rank that calls it reads the file itself.
    Everything is checked (`fit_errors`) before the model changes. The model
    keeps its devices and dtypes: each tensor of the file is cast to its own.
    A sharded model (`parallel=fsdp`: DTensor parameters) is filled tensor by
    tensor (`open_weights`), each rank keeping only its slice of each, so no
    rank ever holds the whole model; a whole model through `load_state_dict`.

    Args:
        model: the model (a DDP wrapper is looked through); not on the meta device.
        path: a file `read_weights` accepts.
        strict: as for torch's `load_state_dict`; shapes must match either way.
        key: the config key error messages start with.

    Raises:
        ValueError: the weights do not fit (every problem, one per line), the
            model is on the meta device, or `path` cannot be read (see `read_weights`).
        WeightsFileNotFoundError, TypeError: as for `read_weights` and `fit_errors`.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    module = unwrap_model(model)
    own = module.state_dict()
    on_meta = [name for name, value in own.items() if isinstance(value, torch.Tensor) and value.is_meta]
    if on_meta:
        raise ValueError(
            f"{key}: load_weights needs a model with storage, but {len(on_meta)} of its tensors "
            f"are on the meta device ({short_list(on_meta)}): materialize it first, "
            "e.g. model.to_empty(device=...)"
        )
    if _is_sharded(module):
        _load_into_shards(module, path, strict, key)
        return
    weights = read_weights(path)
    errors = fit_errors(model, weights, strict=strict, key=key)
    if errors:
        raise ValueError(f"{key}: the weights in {path} do not fit the model:\n" + "\n".join(errors))
    # The model's dtypes win (a float32 file into a bfloat16 model); load_state_dict copies
    # into the model's own tensors, so their devices stay.
    cast = {
        name: value.to(own[name].dtype)
        if isinstance(own.get(name), torch.Tensor) and value.dtype != own[name].dtype
        else value
        for name, value in weights.items()
    }
    module.load_state_dict(_with_tied(module, cast), strict=strict)


def _load_into_shards(module: torch.nn.Module, path: Path | str | os.PathLike, strict: bool, key: str) -> None:
    """`load_weights` into a sharded model: tensor by tensor, each rank keeping only its slice.

    The same check and messages as for a whole model (`fit_errors`, on the shapes
    alone, before anything changes); then each of the model's tensors is read
    from the file, cast to the model's dtype and cut to this rank's shard
    (`fill_shard`), one at a time: besides its shards a rank holds at most one
    tensor of the file.
    """
    with open_weights(path) as weights:
        errors = fit_errors(module, weights.specs(), strict=strict, key=key)  # type: ignore[attr-defined]
        if errors:
            raise ValueError(f"{key}: the weights in {path} do not fit the model:\n" + "\n".join(errors))
        for name, target in module.state_dict(keep_vars=True).items():
            if name in weights:
                fill_shard(target, weights[name])


def _tensors_to_save(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    tensors, storages = {}, set()
    for name, value in module.state_dict().items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"save_safetensors saves tensors only, but the model's state_dict()[{name!r}] "
                f"is a {type(value).__name__}"
            )
        if value.is_meta:
            raise ValueError(f"save_safetensors needs a model with values, but {name} is on the meta device")
        value = value.detach().cpu().contiguous()
        storage = value.untyped_storage().data_ptr()
        if storage in storages:  # tied weights: safetensors refuses two names on one storage
            value = value.clone()
        storages.add(storage)
        tensors[name] = value
    return tensors


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_safetensors(model: torch.nn.Module, path: str | os.PathLike) -> Path:
    """Write the model's state dict to `path` as safetensors, atomically; return the path.

    Local: not collective (call it on one rank). Written under a temporary
    name beside `path` (its directory is created), fsynced, then renamed onto
    it: a reader sees the previous file or the complete new one, never a part.

    Tied weights (one storage under several names, e.g. a GPT's embedding and
    output matrices) are written once per name, each its own copy, because
    safetensors refuses shared tensors: any reader (`read_weights`,
    `safetensors.torch.load_file`) gets back every name of `model.state_dict()`
    as an independent tensor, at the cost of the duplicates' bytes. Loading
    them into a tied model writes the same values into the shared storage.

    Raises:
        TypeError: `path` is not a str or os.PathLike, or the state dict holds a non-tensor.
        ValueError: the model is on the meta device.
        OSError: the write, fsync or rename failed (the temporary is removed).
    """
    path = as_path(path)
    tensors = _tensors_to_save(unwrap_model(model))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = create_exclusive(path.parent, f".{path.name}.", ".tmp", 0o644)
    os.close(fd)  # save_file writes by name; streaming to it spares a whole in-memory copy of the file
    try:
        # "format": "pt" is what Hugging Face loaders expect of a torch-made file.
        safetensors.torch.save_file(tensors, temporary, metadata={"format": "pt"})
        _fsync_file(temporary)
        atomic.commit(temporary, path)
    except BaseException:
        atomic.remove_quietly(temporary)
        raise
    return path
