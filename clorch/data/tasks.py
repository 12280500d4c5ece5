"""Built-in tasks by name: `build_task`, and sizes without building.

A task's name is its `data` option's (clorch.config.options.data: `data=arithmetic`), whose
class names the task's class; a new task is its class here in clorch.data and its option there.

The protocol every task follows, and the helpers the tasks share, live in
`clorch.data.base`; `Task`, `SPLITS` and `finalize_metrics` are re-exported here so that
code outside `clorch.data` imports all it needs from this one module.

`split_size` and `model_sizes` answer what `len(build_task(...))` and its `model_kwargs()`
would be without building the split's tensors, so a process can plan a run (steps per
epoch, the model's shape) before any rank builds the data.
"""

from __future__ import annotations

from clorch.config import registry
from clorch.data.base import SPLITS, Task, TaskSizes, finalize_metrics

__all__ = ["SPLITS", "Task", "build_task", "finalize_metrics", "model_sizes", "split_size", "task_names"]


def task_names() -> tuple[str, ...]:
    """The built-in tasks: the `data` options that name a task class."""
    return tuple(name for name, option in registry.options("data").items() if getattr(option, "task", None))


def _task_class(name: str, kwargs: dict) -> type:
    """The class registered as `name`, once `kwargs` are known to be arguments it takes.

    Raises:
        ValueError: unknown name.
        TypeError: an argument the task does not take.
    """
    if name not in task_names():
        raise ValueError(f"task name must be one of {', '.join(task_names())}, got {name!r}")
    cls = registry.resolve(registry.options("data")[name].task)
    allowed = cls.ARGUMENTS
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise TypeError(
            f"build_task({name!r}) got unknown argument(s) {', '.join(map(repr, unknown))}; "
            f"allowed: {', '.join(allowed)}"
        )
    return cls


def build_task(name: str, *, split: str, seed: int, **kwargs) -> Task:
    """Build one split of a task by name.

    Args:
        name: "synthetic", "arithmetic", "text" or "tokens".
        split: "train" or "eval"; for a given seed the two are disjoint.
        seed: picks the data (and, for synthetic, the teacher).
        **kwargs: the task class's other arguments (`SyntheticRegression`,
            `ArithmeticTask`, `ByteTextTask`).

    Raises:
        ValueError: unknown name or split, or a bad argument value.
        TypeError: an argument the task does not take.
    """
    return _task_class(name, kwargs)(split=split, seed=seed, **kwargs)


def _sizes(name: str, split: str, seed: int, kwargs: dict) -> TaskSizes:
    return _task_class(name, kwargs).sizes(split=split, seed=seed, **kwargs)


def split_size(name: str, split: str, seed: int, **kwargs) -> int:
    """`len(build_task(name, split=split, seed=seed, **kwargs))`, without building the split.

    Cheap: arithmetic on the arguments, and for "text" one stat of the file. For
    "arithmetic" it also replays the random pairs of the draw (not its tokens), since
    only they tell whether the split has enough pairs to draw from.

    Args:
        name: "synthetic", "arithmetic", "text" or "tokens".
        split: "train" or "eval".
        seed: as for `build_task`.
        **kwargs: the task class's other arguments, as for `build_task`.

    Raises:
        ValueError, TypeError: what `build_task` raises for the same arguments.
    """
    return _sizes(name, split, seed, kwargs).samples


def model_sizes(name: str, **kwargs) -> dict:
    """`build_task(name, split="train", seed=0, **kwargs).model_kwargs()`, without building it.

    The model's sizes do not depend on the split or seed; these two are fixed only so
    that the same arguments fail here exactly as they would there.

    Args:
        name: "synthetic", "arithmetic", "text" or "tokens".
        **kwargs: the task class's other arguments, as for `build_task`.

    Raises:
        ValueError, TypeError: what that `build_task` call raises.
    """
    return _sizes(name, "train", 0, kwargs).model_kwargs
