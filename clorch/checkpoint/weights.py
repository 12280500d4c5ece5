"""Model weights alone: read them from a file, check they fit a model, load them, export them.

`read_weights` takes three kinds of file and tells them apart by content:

    clorch checkpoint   the metadata file `save_checkpoint` wrote (JSON declaring
                        format "clorch-checkpoint"); its archive is verified block
                        by block before the model's tensors are taken from it
    safetensors         by the name's `.safetensors` suffix, or by its header (an
                        8-byte little-endian length, then a JSON object)
    torch state dict    anything else, by `torch.load(weights_only=True)`: a
                        state dict, or a dict holding one under "model" or "state_dict"

and a directory: a Hugging Face `save_pretrained` folder, whose `model.safetensors`
(or the shards its index lists, `clorch.checkpoint.hf_folder`) is read as above.

Only tensors are read: no kind runs code from the file. A `module.` prefix on
every key (torch DDP's state dict) and an `_orig_mod.` prefix (a
torch.compile'd model's, as in nanoGPT's checkpoints) are stripped, whatever
the kind. Tensors a model shares under two names (a language model's output
matrix tied to its token embedding) need only one of them in the file, as Hugging
Face saves them.

`fit_errors` compares names and shapes only, so it works on a model built on
the `meta` device, before any process starts; `load_weights` then copies the
weights into a real model, or tensor by tensor into a sharded one
(`open_weights` reads one tensor at a time). `save_safetensors` exports a
model's weights.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Mapping

import safetensors.torch
import torch
from torch.distributed.tensor import DTensor

from clorch._files import create_exclusive
from clorch.checkpoint import archive, atomic, metadata
from clorch.checkpoint.errors import CheckpointError
from clorch.checkpoint.hf_folder import weight_files
from clorch.nn.parallel.ddp import unwrap_model
from clorch.nn.parallel.fsdp_init import fill_shard

KINDS = (
    "a clorch checkpoint (the path given to save_checkpoint)",
    "a torch.save'd state_dict (alone, or under a 'model' or 'state_dict' key)",
    "a .safetensors file",
    "a Hugging Face save_pretrained folder",
)
"""The kinds of file `read_weights` accepts, as its errors name them."""

_ACCEPTED = "it must be " + ", ".join(KINDS[:-1]) + " or " + KINDS[-1]
# DDP's (torch's and clorch's state_dict) and torch.compile's (nanoGPT's usual checkpoint).
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")
_SHOWN = 5  # names listed per message; the count says how many there are in all
_HEAD_BYTES = 16
_NOT_STRICT = "model.init_strict=false (strict=False in Python)"


class WeightsFileNotFoundError(FileNotFoundError, ValueError):
    """No file at the path given for weights: also a ValueError, so config checks collect it.

    (`io.UnsupportedOperation` is likewise both an OSError and a ValueError.)
    """


def _as_path(path: Any) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    return Path(path)


def _head(path: Path) -> tuple[bytes, int]:
    """The first bytes of `path` and its size; refuses what is not a regular file (a FIFO never blocks)."""
    try:
        fd = atomic.open_regular(path, "weights file")
    except FileNotFoundError:
        raise WeightsFileNotFoundError(f"no weights file at {path}") from None
    except CheckpointError as exc:  # a directory, a FIFO, a device: never read
        raise ValueError(str(exc)) from None
    try:
        return os.pread(fd, _HEAD_BYTES, 0), os.fstat(fd).st_size
    finally:
        os.close(fd)


def _is_safetensors(path: Path, head: bytes, size: int) -> bool:
    if path.suffix == ".safetensors":
        return True
    header_bytes = int.from_bytes(head[:8], "little")
    return head[8:9] == b"{" and 2 <= header_bytes <= size - 8


def _strip_wrapper_prefixes(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Without the prefix a wrapper put on every key, as often as one is there (DDP over a compiled model
    gives `module._orig_mod.`)."""
    while weights:
        prefix = next((p for p in _WRAPPER_PREFIXES if all(name.startswith(p) for name in weights)), None)
        if prefix is None:
            break
        weights = {name[len(prefix) :]: tensor for name, tensor in weights.items()}
    return weights


def _read_clorch(path: Path) -> dict[str, torch.Tensor]:
    # clorch.checkpoint.load_checkpoint would also restore RNG states and is collective:
    # only its verified read is wanted here.
    try:
        body = metadata.read(path)
        tensors = archive.read_archive(metadata.archive_path(path, body), body["archive"], path)
    except CheckpointError as exc:
        raise ValueError(f"cannot read the weights of clorch checkpoint {path}: {exc}") from exc
    if not isinstance(tensors, dict) or not _is_state_dict(tensors.get("model")):
        raise ValueError(
            f"cannot read the weights of clorch checkpoint {path}: its archive holds no 'model' state dict of tensors"
        )
    return dict(tensors["model"])


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return safetensors.torch.load_file(path, device="cpu")
    except safetensors.SafetensorError as exc:
        raise ValueError(f"{path} is not a readable safetensors file ({exc}): {_ACCEPTED}") from None


def _torch_load_reason(exc: Exception) -> str:
    """One line out of torch.load's error; its weights_only message is a page long."""
    text = str(exc).strip()
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1].strip().split(". ", 1)[0]
    line = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {line[:200]}" if line else type(exc).__name__


def _read_torch(path: Path, mmap: bool = False) -> dict[str, torch.Tensor]:
    """The state dict of a torch.save file; with `mmap`, its tensors map the file (read when used),
    unless the file is of torch's legacy (pre-zip) format, which cannot be mapped: then it is read whole."""
    try:
        try:
            loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except RuntimeError as exc:
            if not (mmap and "mmap" in str(exc)):
                raise
            loaded = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, MemoryError):
        raise
    except Exception as exc:  # arbitrary bytes make torch.load raise nearly any type; none ran code
        hint = ""
        if isinstance(exc, pickle.UnpicklingError) and "Unsupported global" in str(exc):
            hint = (
                " (it holds pickled objects, not only tensors: a whole model saved with "
                "torch.save(model)? save model.state_dict() instead)"
            )
        raise ValueError(
            f"{path} is not a file of model weights: torch.load(weights_only=True) failed "
            f"with {_torch_load_reason(exc)}{hint}; {_ACCEPTED}"
        ) from None
    return _state_dict_in(path, loaded)


def _is_state_dict(value: Any) -> bool:
    return isinstance(value, Mapping) and all(
        isinstance(name, str) and isinstance(tensor, torch.Tensor) for name, tensor in value.items()
    )


def _state_dict_in(path: Path, loaded: Any) -> dict[str, torch.Tensor]:
    """`loaded` itself when it is a state dict, else the one state dict under "model" or "state_dict"."""
    if _is_state_dict(loaded):
        return dict(loaded)
    held = [key for key in ("model", "state_dict") if isinstance(loaded, Mapping) and _is_state_dict(loaded.get(key))]
    if len(held) > 1:
        raise ValueError(
            f"{path} holds a state dict under both 'model' and 'state_dict': "
            "which one is the model's is ambiguous; save the one you mean alone"
        )
    if held:
        return dict(loaded[held[0]])
    what = (
        f"a dict with keys {_listed([str(k) for k in loaded])}"
        if isinstance(loaded, Mapping)
        else f"a {type(loaded).__name__}"
    )
    raise ValueError(f"{path} is a torch.save file holding {what}, not a state dict of tensors: {_ACCEPTED}")


def read_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The model weights held in a file, on the CPU, by parameter and buffer name.

    Local: not collective, any rank may call it. The file's dtypes are kept.
    Tensors of a clorch checkpoint map its (verified) archive file rather than
    being copied into memory; clone them to change them.

    Args:
        path: a clorch checkpoint, a torch.save'd state dict (alone or under a
            "model" or "state_dict" key), a safetensors file, or a Hugging Face
            save_pretrained folder (see the module docstring).

    Returns:
        The state dict, without the `module.` prefix torch DDP puts on every key
        and the `_orig_mod.` prefix of a torch.compile'd model.

    Raises:
        WeightsFileNotFoundError: nothing at `path` (both a FileNotFoundError and a ValueError).
        ValueError: `path` is not a regular file or a folder with weights, is none of the
            kinds, holds pickled objects, or is a clorch checkpoint failing its integrity checks.
        TypeError: `path` is not a str or os.PathLike.
    """
    path = _as_path(path)
    if path.is_dir():
        return _read_folder(path)
    kind = _kind(path)
    if kind == "safetensors":
        weights = _read_safetensors(path)
    elif kind == "clorch":
        weights = _read_clorch(path)
    else:
        weights = _read_torch(path)
    return _strip_wrapper_prefixes(weights)


def _read_folder(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face save_pretrained folder's weight files, refusing a name held twice."""
    weights: dict[str, torch.Tensor] = {}
    for path in weight_files(folder):
        part = read_weights(path)
        _refuse_twice(folder, weights, part)
        weights.update(part)
    return weights


def _refuse_twice(folder: Path, seen: Mapping[str, Any], part: Mapping[str, Any]) -> None:
    twice = [name for name in part if name in seen]
    if twice:
        raise ValueError(f"{folder}: tensor(s) held by two of its weight files: {_listed(twice)}")


def _kind(path: Path) -> str:
    """Which of the three kinds of weights file `path` is: "safetensors", "clorch" or "torch".

    Raises:
        ValueError: a JSON file that is not a clorch checkpoint (and what `_head` raises).
    """
    head, size = _head(path)
    if _is_safetensors(path, head, size):
        return "safetensors"
    if head.lstrip()[:1] == b"{":  # JSON: only clorch's metadata among the three kinds
        if not metadata.is_checkpoint(path):
            raise ValueError(f"{path} is a JSON file but not a clorch checkpoint: {_ACCEPTED}")
        return "clorch"
    return "torch"


class _LazyWeights(Mapping[str, torch.Tensor]):
    """A weights file's tensors by name, each read from the file when it is asked for (see `open_weights`)."""

    def __init__(self, shapes: dict[str, torch.Size], read: Any):
        self._shapes, self._read = shapes, read

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._shapes:
            raise KeyError(name)
        return self._read(name)

    def __iter__(self):
        return iter(self._shapes)

    def __len__(self) -> int:
        return len(self._shapes)

    def specs(self) -> dict[str, torch.Tensor]:
        """Every name with a meta tensor of its shape: what `fit_errors` compares, nothing read."""
        return {name: torch.empty(shape, device="meta") for name, shape in self._shapes.items()}


def _stripped_names(names: list[str]) -> dict[str, str]:
    """{name without the wrapper prefixes: name in the file} (see `_strip_wrapper_prefixes`)."""
    return dict(zip(_strip_wrapper_prefixes(dict.fromkeys(names)), names))  # type: ignore[arg-type]


def _lazy_safetensors(path: Path, handle: Any) -> _LazyWeights:
    try:
        names = _stripped_names(list(handle.keys()))
        shapes = {name: torch.Size(handle.get_slice(raw).get_shape()) for name, raw in names.items()}
    except safetensors.SafetensorError as exc:
        raise ValueError(f"{path} is not a readable safetensors file ({exc}): {_ACCEPTED}") from None
    return _LazyWeights(shapes, lambda name: handle.get_tensor(names[name]))


def _lazy_mapped(weights: dict[str, torch.Tensor]) -> _LazyWeights:
    weights = _strip_wrapper_prefixes(weights)
    return _LazyWeights({name: value.shape for name, value in weights.items()}, weights.__getitem__)


@contextlib.contextmanager
def open_weights(path: str | os.PathLike) -> Iterator[Mapping[str, torch.Tensor]]:
    """The weights in a file, each tensor read only when it is asked for; `read_weights` reads all.

    The mapping's keys are known at once (without the wrapper prefixes, as
    `read_weights` strips them), and `mapping.specs()` gives their shapes as
    meta tensors for `fit_errors`. `mapping[name]` reads that one tensor:
    from a safetensors file by `safe_open` (a copy of that tensor only); from
    a torch.save file or a clorch checkpoint's archive, a tensor that maps
    the file (`torch.load(mmap=True)`), so its pages are read when it is
    used and belong to the page cache, not to the process's heap. A torch
    file of the legacy (pre-zip) format cannot be mapped and is read whole.
    A clorch checkpoint's archive is verified first (read through once,
    block by block, as `read_weights` does).

    Local: not collective. Use the tensors inside the `with` block.

    Raises:
        As `read_weights`.
    """
    path = _as_path(path)
    if path.is_dir():
        with _open_folder(path) as weights:
            yield weights
        return
    kind = _kind(path)
    if kind == "safetensors":
        try:
            handle = safetensors.safe_open(path, framework="pt", device="cpu")
        except safetensors.SafetensorError as exc:
            raise ValueError(f"{path} is not a readable safetensors file ({exc}): {_ACCEPTED}") from None
        with handle:
            yield _lazy_safetensors(path, handle)
    elif kind == "clorch":
        yield _lazy_mapped(_read_clorch(path))
    else:
        yield _lazy_mapped(_read_torch(path, mmap=True))


@contextlib.contextmanager
def _open_folder(folder: Path) -> Iterator[_LazyWeights]:
    """`open_weights` over the weight files of a Hugging Face save_pretrained folder, each opened once."""
    with contextlib.ExitStack() as stack:
        owner: dict[str, Mapping[str, torch.Tensor]] = {}
        shapes: dict[str, torch.Size] = {}
        for path in weight_files(folder):
            part = stack.enter_context(open_weights(path))
            _refuse_twice(folder, owner, part)
            owner.update(dict.fromkeys(part, part))
            shapes.update({name: spec.shape for name, spec in part.specs().items()})  # type: ignore[attr-defined]
        yield _LazyWeights(shapes, lambda name: owner[name][name])


def weight_names(path: str | os.PathLike) -> set[str]:
    """The names of the tensors in a weights file (as `read_weights` gives them), reading no tensor.

    Raises:
        As `read_weights`.
    """
    with open_weights(path) as weights:
        return set(weights)


def _is_sharded(module: torch.nn.Module) -> bool:
    return any(isinstance(p, DTensor) for p in module.parameters())


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:_SHOWN])
    return shown + (f", ... ({len(names) - _SHOWN} more)" if len(names) > _SHOWN else "")


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
        errors.append(f"{key}: {len(not_tensors)} value(s) in the file are not tensors: {_listed(not_tensors)}")
    if shapes:
        errors.append(
            f"{key}: {len(shapes)} tensor(s) have another shape in the file than in the model: {_listed(shapes)}"
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
            f"{key}: {len(missing)} key(s) of the model are missing from the file: {_listed(missing)}"
            + (f"; {_NOT_STRICT} loads the file's keys and keeps the model's own values for these" if shared else "")
        )
    if strict and unexpected:
        errors.append(
            f"{key}: {len(unexpected)} key(s) in the file are not in the model: {_listed(unexpected)}"
            + (f"; {_NOT_STRICT} leaves them out" if shared else "")
        )
    if not strict and expected and len(missing) == len(expected):
        errors.append(
            f"{key}: none of the file's {len(weights)} key(s) is a key of the model, so a "
            f"non-strict load would load nothing: the file has {_listed(unexpected) or 'no keys'}; "
            f"the model has {_listed(missing)}"
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
            f"are on the meta device ({_listed(on_meta)}): materialize it first, "
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
    path = _as_path(path)
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
