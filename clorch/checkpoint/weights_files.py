"""Model weights read from a file: a clorch checkpoint, safetensors, a torch state dict or a folder.

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
the kind. `open_weights` reads one tensor at a time; `weight_names` only the names.
clorch.checkpoint.weights fits them to a model.
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

from clorch.checkpoint import archive, atomic, metadata
from clorch.checkpoint.errors import CheckpointError
from clorch.checkpoint.hf_folder import weight_files

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
_HEAD_BYTES = 16
_SHOWN = 5  # names listed per message; the count says how many there are in all


def short_list(names: list[str]) -> str:
    """The first few names, and how many more there are."""
    shown = ", ".join(names[:_SHOWN])
    return shown + (f", ... ({len(names) - _SHOWN} more)" if len(names) > _SHOWN else "")


class WeightsFileNotFoundError(FileNotFoundError, ValueError):
    """No file at the path given for weights: also a ValueError, so config checks collect it.

    (`io.UnsupportedOperation` is likewise both an OSError and a ValueError.)
    """


def as_path(path: Any) -> Path:
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
        f"a dict with keys {short_list([str(k) for k in loaded])}"
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
    path = as_path(path)
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
        raise ValueError(f"{folder}: tensor(s) held by two of its weight files: {short_list(twice)}")


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
    path = as_path(path)
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
