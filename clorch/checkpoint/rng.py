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


def restore_rng(state: dict[str, Any]) -> None:
    """Put every generator captured by `capture_rng` back (CUDA onto the device it came from).

    Warns (and skips that one generator) where it cannot be restored here:
    numpy missing, or a CUDA state on a process without that CUDA device.
    """
    torch.set_rng_state(_text_to_bytes(state["torch"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if state.get("numpy") is not None:
        if np is None:
            warnings.warn("checkpoint holds a numpy RNG state but numpy is not installed; not restored",
                          stacklevel=2)
        else:
            name, keys, pos, has_gauss, cached = state["numpy"]
            np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    cuda = state.get("cuda")
    if cuda is not None:
        if torch.cuda.is_available() and cuda["device"] < torch.cuda.device_count():
            torch.cuda.set_rng_state(_text_to_bytes(cuda["state"]), cuda["device"])
        else:
            warnings.warn(f"checkpoint holds the RNG state of CUDA device {cuda['device']}, which this "
                          "process does not have; CUDA RNG not restored", stacklevel=2)


def check_rng_state(state: Any, where: str) -> None:
    """Raise ValueError (naming `where`) if `state` is not what `capture_rng` makes."""
    ok = (isinstance(state, dict) and isinstance(state.get("torch"), str)
          and isinstance(state.get("python"), list) and len(state["python"]) == 3)
    if not ok:
        raise ValueError(f"{where} is not an RNG state written by clorch")
