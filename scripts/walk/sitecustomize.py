"""Records, in every Python process of a `clorch-train` run, the calls that carry one setting.

Loaded by `scripts/walk/count.py` (it puts this folder first on PYTHONPATH); does nothing
unless WALK_MARK is set. A call *carries* the setting when the value (WALK_MARK: a number's
repr, or text contained in a string) is among its arguments, or inside them (containers,
dataclasses, clorch objects, a few levels deep), or in what it returns. Each process writes
`walk.<pid>.jsonl` into WALK_DIR: one line per carrying call (with the ids of the clorch
frames above it), one per carrying return, and the calls of WALK_END (`file.py:function`
under clorch/), recorded whether they carry or not.
"""

import dataclasses
import importlib.util
import json
import os
import sys
import threading

_MARK = os.environ.get("WALK_MARK")
_DEPTH = 6


def _carries(value, depth=0):
    """Whether `value` holds the setting (never raises: a value may be half-built)."""
    try:
        kind = type(value)
        if depth > _DEPTH or kind.__name__ in ("Tensor", "Parameter", "DTensor", "module"):
            return False
        if isinstance(value, bool) or value is None:
            return False
        if isinstance(value, (int, float)):
            return repr(value) == _MARK
        if isinstance(value, str):
            return _MARK in value
        if isinstance(value, dict) or kind.__name__ == "DictConfig":
            return any(_carries(item, depth + 1) for item in list(value.values())[:200])
        if isinstance(value, (list, tuple, set)) or kind.__name__ == "ListConfig":
            return any(_carries(item, depth + 1) for item in list(value)[:200])
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return any(_carries(getattr(value, f.name, None), depth + 1) for f in dataclasses.fields(value))
        if "clorch" in (kind.__module__ or "") and hasattr(value, "__dict__"):
            items = list(vars(value).items())[:60]
            return any(_carries(item, depth + 1) for name, item in items if not name.startswith("__"))
    except Exception:
        return False
    return False


def _package_dir():
    """The folder of the clorch package this process imports (found without importing it), with
    a trailing separator; None when there is none."""
    spec = importlib.util.find_spec("clorch")
    return os.path.dirname(spec.origin) + os.sep if spec is not None and spec.origin else None


def _where(code):
    """The clorch module a code object belongs to (`plan/plan.py`), or None for any other code."""
    path = code.co_filename
    return path[len(_PACKAGE) :] if _PACKAGE and path.startswith(_PACKAGE) else None


def _arguments(frame):
    code = frame.f_code
    count = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 4) + bool(code.co_flags & 8)
    return [frame.f_locals.get(name) for name in code.co_varnames[:count]]


def _members(value, depth=0):
    """`value`, what it holds directly, and every container or object it holds deeper, that carry
    the value (where a returned object, or part of it, may be handed on).
    A number or a string deeper inside is left out: one such object is shared by every copy of
    its container (`dataclasses.asdict` copies the containers only), so its id says nothing
    about who made what."""
    members = []
    try:
        if isinstance(value, dict):
            members = list(value.values())
        elif isinstance(value, (list, tuple)):
            members = list(value)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            members = [getattr(value, f.name, None) for f in dataclasses.fields(value)]
        elif hasattr(value, "__dict__"):
            members = list(vars(value).values())
    except Exception:
        pass
    found = [value]
    if depth < _DEPTH:
        for member in members[:200]:
            if (depth == 0 or not isinstance(member, (str, bytes, int, float))) and _carries(member):
                found += _members(member, depth + 1)
    return found


def _ids(objects, kept):
    """The ids of `objects`, each kept alive (in `kept`) so that no later object takes its id."""
    kept.append(objects)
    return [id(o) for o in objects]


def _stack(frame):
    ids = []
    frame = frame.f_back
    while frame is not None:
        if _where(frame.f_code):
            ids.append(id(frame))
        frame = frame.f_back
    return ids


def _start():
    out = open(os.path.join(os.environ["WALK_DIR"], f"walk.{os.getpid()}.jsonl"), "a")
    end = os.environ.get("WALK_END", "")
    lock = threading.Lock()
    counter = [0]
    kept = []  # every object whose id is written stays alive (`_ids`), so that no other object takes its id
    recorded = set()  # the frames whose call was written: their return is written too

    def write(record):
        with lock:
            counter[0] += 1
            record["seq"] = counter[0]
            out.write(json.dumps(record) + "\n")
            out.flush()

    def profile(frame, event, arg):
        if event not in ("call", "return"):
            return
        where = _where(frame.f_code)
        if where is None or frame.f_code.co_name.startswith("<"):  # comprehensions are not calls
            return
        name = f"{where}:{frame.f_code.co_name}"
        if event == "call":
            values = [value for value in _arguments(frame) if _carries(value)]
            carried = [_ids(_members(value), kept) for value in values]
            if name == end or carried:
                recorded.add(id(frame))
                write({"call": name, "frame": id(frame), "stack": _stack(frame), "args": carried, "end": name == end})
        elif _carries(arg):
            recorded.discard(id(frame))
            write({"return": name, "frame": id(frame), "stack": _stack(frame), "ids": _ids(_members(arg), kept)})
        elif id(frame) in recorded:
            recorded.discard(id(frame))
            write({"return": name, "frame": id(frame), "stack": [], "ids": []})

    def audit(event, args):
        try:
            _audit(event, args)
        except Exception:  # an audit hook that raises stops the operation
            pass

    def _audit(event, args):
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.fsdecode(args[0])
            if path.endswith((".py", ".pyc", ".so", ".pth")) or "-packages/" in path:
                return  # imports
            mode = args[1] or "r"
            writing = any(c in mode for c in "wax+") or (args[2] or 0) & (os.O_WRONLY | os.O_RDWR)
            frame = sys._getframe(1)
            stack = [id(frame)] + _stack(frame) if _where(frame.f_code) else _stack(frame)
            write({"write" if writing else "read": path, "stack": stack})
        elif event == "os.rename":
            write({"rename": os.fsdecode(args[0]), "to": os.fsdecode(args[1])})

    sys.addaudithook(audit)
    sys.setprofile(profile)
    threading.setprofile(profile)


if _MARK:
    _PACKAGE = _package_dir()
    _start()
