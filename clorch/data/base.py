"""The task protocol: what every dataset offers the engine, and the helpers tasks share.

A task holds its whole split as pre-built tensors, on the CPU until the engine
places a small enough split on its GPU (`clorch.data.placement`). The engine's
loop never looks inside a batch; it only calls:

    batch = task.batch(indices)                 # dict of tensors, a vectorized gather
    batch = {k: v.to(device) for k, v in batch.items()}   # a no-op once placed
    loss = task.loss(model, batch)              # scalar, mean over the batch's samples
    sums = task.eval_sums(model, batch)         # 0-d float64 tensors on the batch's device

`eval_sums` returns `count` (samples in the batch) and one `<metric>_sum` per metric, the
metric summed over samples, so the engine can `all_reduce` every value across ranks and
divide exactly: metric = `<metric>_sum / count` (see `finalize_metrics`). Every loss is a
mean over samples of a per-sample mean, so the training loss and the eval loss agree.

Splits are deterministic for a seed, and the train and eval splits are disjoint.

Every task class also offers `sizes(...)`, a classmethod taking its constructor's
arguments that returns `TaskSizes` without building the split's tensors, so a process
can plan a run (steps per epoch, the model's shape) before any rank builds the data.
`sizes_of(__init__)` makes it one: the signature is written once, in `__init__`.

This module imports no task module: the task modules import it, and the registry
(`clorch.data.tasks`) imports them all.
"""

from __future__ import annotations

import functools
import inspect
from types import SimpleNamespace
from typing import Any, Callable, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

SPLITS = ("train", "eval")


@runtime_checkable
class Task(Protocol):
    """A dataset plus its loss and eval metrics (see the module docstring)."""

    tokens_per_sample: int | None  # model input tokens per sample; None for regression

    def __len__(self) -> int: ...

    def batch(self, indices: torch.Tensor | list[int]) -> dict[str, torch.Tensor]: ...

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor: ...

    def eval_sums(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...

    def model_kwargs(self) -> dict: ...


class TaskSizes(NamedTuple):
    """What a task class's `sizes(...)` reports about one split, without building it.

    Attributes:
        samples: `len(task)` of the split the arguments describe.
        model_kwargs: `task.model_kwargs()` of that split.
    """

    samples: int
    model_kwargs: dict


def sizes_of(init: Callable[..., None]) -> Callable[[Callable[[type, SimpleNamespace], TaskSizes]], Any]:
    """Decorate a task's `sizes` so it takes the arguments of its constructor `init`.

    In the class body, under `__init__`: `@sizes_of(__init__)` over `def sizes(cls, a)`, which
    reads the constructor's arguments by name (`a.seq_len`), defaults filled in. The result is
    a classmethod whose signature (`inspect.signature(Task.sizes)`) is the constructor's, and
    arguments the constructor would refuse raise its own TypeError, naming the argument.
    """
    signature = inspect.signature(init)

    def decorate(compute: Callable[[type, SimpleNamespace], TaskSizes]) -> Any:
        @functools.wraps(compute)
        def sizes(cls: type, *args: Any, **kwargs: Any) -> TaskSizes:
            try:
                bound = signature.bind(cls, *args, **kwargs)
            except TypeError:
                # Python's own message for the constructor ("missing 1 required positional
                # argument: 'path'"): the same arguments fail its call before its body runs.
                init(cls, *args, **kwargs)
                raise
            bound.apply_defaults()
            _, *names = signature.parameters
            return compute(cls, SimpleNamespace(**{name: bound.arguments[name] for name in names}))

        # The constructor's parameters (its first, `self`, stands for `cls`) and `compute`'s return.
        returns = inspect.signature(compute).return_annotation
        sizes.__signature__ = signature.replace(return_annotation=returns)  # type: ignore[attr-defined]
        return classmethod(sizes)

    return decorate


def finalize_metrics(sums: dict[str, torch.Tensor]) -> dict[str, float]:
    """Turn (all-reduced) `eval_sums` into metrics: `{"loss": loss_sum / count, ...}`.

    Call it after the all_reduce: it reads each value to the host, which waits for the
    device (a synchronization point on CUDA) on the calling rank only.

    Raises:
        ValueError: `count` is missing or zero.
    """
    count = float(sums.get("count", 0.0))
    if count <= 0:
        raise ValueError(f"eval sums need a positive 'count', got {sums.get('count')!r}")
    return {k[: -len("_sum")]: float(v) / count for k, v in sums.items() if k.endswith("_sum")}


def check_seed(owner: str, seed: object) -> None:
    """Raise ValueError naming `owner.seed` unless `seed` is an int >= 0."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"{owner}.seed must be a non-negative int, got {seed!r}")


def derive_seed(seed: int, *stream: int) -> int:
    """A 63-bit seed for one independent stream (teacher, train split, eval split) of `seed`."""
    state = np.random.SeedSequence([int(seed), *stream]).generate_state(2, dtype=np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1]))


def generator(seed: int, *stream: int) -> torch.Generator:
    """A CPU generator for one stream of `seed` (see `derive_seed`)."""
    return torch.Generator().manual_seed(derive_seed(seed, *stream))


def check_positive_int(owner: str, name: str, value: object) -> None:
    """Raise ValueError naming `owner.name` unless `value` is an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}.{name} must be a positive int, got {value!r}")


def check_fraction(owner: str, name: str, value: object) -> None:
    """Raise ValueError naming `owner.name` unless `value` is a number in (0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
        raise ValueError(f"{owner}.{name} must be a number in (0, 1), got {value!r}")


def check_split(owner: str, split: object) -> None:
    """Raise ValueError unless `split` is "train" or "eval"."""
    if split not in SPLITS:
        raise ValueError(f"{owner}.split must be one of {', '.join(SPLITS)}, got {split!r}")


def as_index(
    indices: torch.Tensor | list[int], device: torch.device | None = None, size: int | None = None
) -> torch.Tensor:
    """Indices as an int64 tensor on `device` (the CPU by default), for gathering a split there.

    On the CPU an out-of-range index fails in the gather, as in torch. For a
    split on a GPU, where it would be a device-side assert, indices coming from
    the host are checked against `size` first. The copy to a GPU does not block
    the host (a CPU index tensor used directly would be copied with a
    synchronization).

    Raises:
        IndexError: an index outside [-size, size) bound for a GPU split.
    """
    if isinstance(indices, torch.Tensor):
        index = indices.to(dtype=torch.long)
    else:
        index = torch.as_tensor(indices, dtype=torch.long)
    if device is None or device.type == "cpu":
        return index.cpu()
    if size is not None and index.device.type == "cpu" and index.numel():
        low, high = int(index.min()), int(index.max())
        if low < -size or high >= size:
            bad = high if high >= size else low
            raise IndexError(f"index {bad} is out of range for a split of {size} samples")
    return index.to(device, non_blocking=True)


def count_like(tensor: torch.Tensor) -> torch.Tensor:
    """The batch size as a 0-d float64 tensor on `tensor`'s device (a fill, no host copy)."""
    return torch.full((), tensor.size(0), dtype=torch.float64, device=tensor.device)
