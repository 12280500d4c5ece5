"""Check a loaded checkpoint against the live model and optimizer before anything is changed.

Loading is all or nothing: every mismatch is found and reported (all of them,
in one error) before the first `load_state_dict` runs.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

_LIST_LIMIT = 20


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:_LIST_LIMIT])
    return shown + (f", ... ({len(names) - _LIST_LIMIT} more)" if len(names) > _LIST_LIMIT else "")


def model_mismatches(expected: Mapping[str, Any], loaded: Any) -> list[str]:
    """Missing, unexpected and mis-shaped keys of `loaded` against the model's own state dict."""
    if not isinstance(loaded, Mapping):
        return [f"the checkpoint's model state is a {type(loaded).__name__}, not a dict"]
    missing = [key for key in expected if key not in loaded]
    unexpected = [str(key) for key in loaded if key not in expected]
    shapes = []
    for key, want in expected.items():
        got = loaded.get(key)
        if isinstance(want, torch.Tensor) and key in loaded:
            if not isinstance(got, torch.Tensor):
                shapes.append(f"{key}: checkpoint holds {type(got).__name__}, model has a tensor")
            elif got.shape != want.shape:
                shapes.append(f"{key}: checkpoint {tuple(got.shape)}, model {tuple(want.shape)}")
    problems = []
    if missing:
        problems.append(f"missing keys (in the model, not in the checkpoint): {_listed(missing)}")
    if unexpected:
        problems.append(f"unexpected keys (in the checkpoint, not in the model): {_listed(unexpected)}")
    if shapes:
        problems.append(f"mis-shaped keys: {_listed(shapes)}")
    return problems


def optimizer_mismatches(optimizer: Any, loaded: Any) -> list[str]:
    """Group structure, state entries and state tensor shapes of `loaded` against the optimizer."""
    if not isinstance(loaded, Mapping) or "state" not in loaded or "param_groups" not in loaded:
        return ["the checkpoint's optimizer state is not a torch optimizer state dict"]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    saved_sizes = [len(group.get("params", ())) for group in loaded["param_groups"]]
    live_sizes = [len(group["params"]) for group in optimizer.param_groups]
    if saved_sizes != live_sizes:
        return [f"optimizer parameter groups differ: checkpoint has sizes {saved_sizes}, the optimizer {live_sizes}"]
    saved_ids = [i for group in loaded["param_groups"] for i in group["params"]]
    position = {pid: index for index, pid in enumerate(saved_ids)}
    unexpected = [str(pid) for pid in loaded["state"] if pid not in position]
    shapes = []
    for pid, entry in loaded["state"].items():
        if pid not in position or not isinstance(entry, Mapping):
            continue
        want = params[position[pid]].shape
        for name, value in entry.items():
            # Per-parameter moments have the parameter's shape; scalars such as `step` do not.
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != want:
                shapes.append(f"state[{pid}][{name!r}]: checkpoint {tuple(value.shape)}, parameter {tuple(want)}")
    problems = []
    if unexpected:
        problems.append(f"unexpected optimizer state entries (no such parameter): {_listed(unexpected)}")
    if shapes:
        problems.append(f"mis-shaped optimizer state: {_listed(shapes)}")
    return problems


def detach_from_file(value: Any) -> Any:
    """A copy of `value` whose tensors own their memory instead of mapping the archive.

    The optimizer and scaler keep the tensors they are given; without this
    they would keep the (possibly pruned) archive file mapped for the rest of the run.
    """
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {key: detach_from_file(item) for key, item in value.items()}
    if isinstance(value, list):
        return [detach_from_file(item) for item in value]
    if isinstance(value, tuple):
        return tuple(detach_from_file(item) for item in value)
    return value
