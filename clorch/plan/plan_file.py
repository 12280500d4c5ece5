"""The launch plan as a file: what the launching process writes and every rank reads.

`write_plan` pickles the checked `Plan` itself after a line with the pickle's sha256 digest,
so the ranks run exactly what was checked (plain values would turn a `_target_` section's
`{0: ...}` into `{"0": ...}`). `read_plan` checks the digest first and then unpickles into
clorch's config classes only (`plan_classes`): a plan file names no function and no other
class, so loading one runs no code. The ranks do not check the plan again.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import typing
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import Any

from clorch._files import write_bytes_atomic
from clorch.config import registry
from clorch.config.schema import TrainConfig
from clorch.plan.interrupted import reraise_interrupt
from clorch.plan.plan import Plan

PLAN_HEADER = b"clorch launch plan 1, sha256 "  # then the digest of the pickle after the line


def write_plan(plan: Plan, path: Path) -> None:
    """Write the plan for the ranks (clorch's launcher's, or torchrun's agent's) to read.

    The checked objects themselves, pickled, after a line with their sha256 digest: the
    ranks run exactly what was checked (plain values would turn a `_target_` section's
    `{0: ...}` into `{"0": ...}`). `read_plan` builds nothing but clorch's config
    dataclasses from it. The checked config as text is the run's config.yaml.
    """
    data = pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL)
    write_bytes_atomic(path, PLAN_HEADER + hashlib.sha256(data).hexdigest().encode() + b"\n" + data)


def _dataclasses_within(cls: type, found: dict[tuple[str, str], type]) -> None:
    """`cls` and every dataclass its fields are typed with or default to, by (module, qualified name)."""
    key = (cls.__module__, cls.__qualname__)
    if key in found or not is_dataclass(cls):
        return
    found[key] = cls
    try:
        hints = list(typing.get_type_hints(cls).values())
    except Exception as exc:  # a hint that does not resolve here: its defaults below still count
        reraise_interrupt(exc)
        hints = []
    held = [f.default for f in fields(cls) if f.default is not MISSING]
    held += [f.default_factory() for f in fields(cls) if f.default_factory is not MISSING]
    for hint in hints:
        for inner in (hint, *typing.get_args(hint)):
            if isinstance(inner, type):
                _dataclasses_within(inner, found)
    for value in held:
        if is_dataclass(value):
            _dataclasses_within(type(value), found)


def plan_classes() -> dict[tuple[str, str], type]:
    """The classes a plan file may name: `Plan`, `TrainConfig`, every registered option's schema and
    `_target_` schema (clorch.config.registry, options of installed packages included), and the
    dataclasses those hold as fields (precision's ScalerConfig). Keyed by where each is defined, so a
    name a module merely imports (torch's StateDictOptions in clorch.train.worker) is not one."""
    found: dict[tuple[str, str], type] = {}
    roots = [Plan, TrainConfig, *registry.custom_groups().values()]
    roots += [cls for group in registry.groups() for cls in registry.schemas(group).values()]
    for cls in roots:
        _dataclasses_within(cls, found)
    return found


class _PlanUnpickler(pickle.Unpickler):
    """Unpickles clorch's config classes (`plan_classes`) and plain values only: a plan file names no
    function, and no other class, so loading one runs no code (`find_class` refuses).

    Their modules are imported with this one (the schema imports every option), so
    nothing is imported here either: importing some of clorch's modules runs a command.
    """

    def __init__(self, file: Any) -> None:
        super().__init__(file)
        self._classes = plan_classes()

    def find_class(self, module: str, name: str) -> Any:
        found = self._classes.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"{module}.{name} is not one of clorch's config classes")
        return found


def read_plan(path: Path) -> Plan:
    """The plan `write_plan` wrote, unchecked but for its digest.

    Raises:
        ValueError: the file is not a plan, or was changed after it was written.
    """
    try:
        head, _, data = Path(path).read_bytes().partition(b"\n")
    except OSError as exc:
        raise ValueError(f"{path} is not a launch plan clorch wrote ({exc})") from None
    if not head.startswith(PLAN_HEADER):
        raise ValueError(f"{path} is not a launch plan clorch wrote (it does not start with {PLAN_HEADER!r})")
    if hashlib.sha256(data).hexdigest().encode() != head[len(PLAN_HEADER) :]:
        raise ValueError(f"{path}: the launch plan was changed after clorch checked it (its digest differs)")
    try:
        plan = _PlanUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # what a pickle that was not clorch's can raise: any of them
        raise ValueError(f"{path} is not a launch plan clorch wrote ({type(exc).__name__}: {exc})") from None
    if not isinstance(plan, Plan):
        raise ValueError(f"{path} is not a launch plan clorch wrote (it holds a {type(plan).__name__})")
    return plan
