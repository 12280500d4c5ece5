"""Capture and restore a process's random-number generators as plain JSON values.

Captured: torch's CPU generator, this process's current CUDA device generator
(only when CUDA is already initialized here, so that a CPU-only rank never
creates a CUDA context), Python's `random`, and numpy's legacy global
generator when numpy is installed. Byte states are base64 text and numpy's
state is lists and ints, so the metadata stays JSON and nothing needs pickle.
"""

from __future__ import annotations

import base64
import random
import warnings
from typing import Any

import torch

try:
    import numpy as np
except ImportError:  # numpy is optional for this module
    np = None


def _bytes_to_text(tensor: torch.Tensor) -> str:
    return base64.b64encode(tensor.numpy().tobytes()).decode("ascii")


def _text_to_bytes(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def capture_rng() -> dict[str, Any]:
    """This process's generator states as a JSON-serializable dict."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": _bytes_to_text(torch.get_rng_state()),
        "python": [version, list(internal), gauss],
        "numpy": None,
        "cuda": None,
    }
    if np is not None:
        name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        state["numpy"] = [str(name), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        index = torch.cuda.current_device()
        state["cuda"] = {"device": index, "state": _bytes_to_text(torch.cuda.get_rng_state(index))}
    return state


# Each _set_* restores one generator through `set_state`, its setter: the global one's in
# restore_rng, a throwaway generator's in rng_state_problem (so both run the same conversion).
def _set_torch(set_state: Any, text: str) -> None:
    set_state(_text_to_bytes(text))


def _set_python(set_state: Any, state: list[Any]) -> None:
    version, internal, gauss = state
    # setstate takes any gauss_next without a check; a bad one would only fail at the next gauss().
    if gauss is not None and not isinstance(gauss, float):
        raise TypeError(f"gauss must be a float or None, got {type(gauss).__name__}")
    set_state((version, tuple(internal), gauss))


def _set_numpy(set_state: Any, state: list[Any]) -> None:
    name, keys, pos, has_gauss, cached = state
    set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


def restore_rng(state: dict[str, Any]) -> None:
    """Put every generator captured by `capture_rng` back (CUDA onto the device it came from).

    Warns (and skips that one generator) where it cannot be restored here:
    numpy missing, or a CUDA state on a process without that CUDA device.
    The state is expected to have passed `rng_state_problem`.
    """
    _set_torch(torch.set_rng_state, state["torch"])
    _set_python(random.setstate, state["python"])
    if state.get("numpy") is not None:
        if np is None:
            warnings.warn("checkpoint holds a numpy RNG state but numpy is not installed; not restored", stacklevel=2)
        else:
            _set_numpy(np.random.set_state, state["numpy"])
    cuda = state.get("cuda")
    if cuda is not None:
        if torch.cuda.is_available() and cuda["device"] < torch.cuda.device_count():
            torch.cuda.set_rng_state(_text_to_bytes(cuda["state"]), cuda["device"])
        else:
            warnings.warn(
                f"checkpoint holds the RNG state of CUDA device {cuda['device']}, which this "
                "process does not have; CUDA RNG not restored",
                stacklevel=2,
            )


# Restoring raises these on a malformed state; OverflowError: a negative or huge int for an unsigned word.
_BAD_STATE = (TypeError, ValueError, OverflowError, RuntimeError)


def _restores(setter: Any, set_state: Any, value: Any) -> bool:
    try:
        setter(set_state, value)
        return True
    except _BAD_STATE:
        return False


def _torch_ok(text: Any) -> bool:
    return isinstance(text, str) and _restores(_set_torch, torch.Generator().set_state, text)


def _python_ok(state: Any) -> bool:
    return isinstance(state, list) and len(state) == 3 and _restores(_set_python, random.Random().setstate, state)


def _numpy_ok(state: Any) -> bool:
    if state is None:
        return True
    if not isinstance(state, list) or len(state) != 5:
        return False
    # Without numpy here it cannot be restored anyway (restore_rng warns); its form is all we check.
    return np is None or _restores(_set_numpy, np.random.RandomState().set_state, state)


def _cuda_problem(cuda: Any) -> str | None:
    if not isinstance(cuda, dict):
        return f"is {type(cuda).__name__}, expected null or a dict with device and state"
    device = cuda.get("device")
    if type(device) is not int or device < 0:
        return f"has device {device!r}, expected an int >= 0"
    try:
        base64.b64decode(cuda.get("state"), validate=True)
    except (TypeError, ValueError):
        return "has a state that is not base64 text"
    return None


def rng_state_problem(state: Any) -> tuple[str | None, str] | None:
    """Why `state` is not what `capture_rng` makes, or None when it can be restored.

    Each part is checked by restoring it into a throwaway generator (CUDA,
    which may be absent here, by its form only), so that a state that passes
    cannot fail in `restore_rng`.

    Returns:
        None, or (the offending key, or None for the whole state; what is wrong with it).
    """
    if not isinstance(state, dict):
        return None, f"is {type(state).__name__}, expected a dict with torch, python, numpy, cuda"
    if not _torch_ok(state.get("torch")):
        return "torch", "is not a torch generator state (base64 text of its bytes)"
    if not _python_ok(state.get("python")):
        return "python", "is not a Python random state ([version, internal state ints, gauss])"
    if not _numpy_ok(state.get("numpy")):
        return "numpy", "is not null or a numpy legacy RNG state ([name, keys, pos, has_gauss, cached])"
    if state.get("cuda") is not None and (problem := _cuda_problem(state["cuda"])):
        return "cuda", problem
    return None
