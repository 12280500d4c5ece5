"""Launcher arguments, checked and resolved before any process starts.

`build_config` turns `launch()`'s keyword arguments into one `LaunchConfig`:
the entry point as "pkg.mod:function", the rank count, each local rank's GPU,
the backend, the node layout (SLURM variables fill what the caller left at its
default). Every user mistake is collected and raised as one ValueError that
names each argument, the value received and what is allowed.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import os
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from clorch.launch.slurm import layout_taken
from clorch.launch.gpus import resolve_ranks

BACKENDS = ("auto", "nccl", "gloo", None)
MAX_SECONDS = 365 * 24 * 3600.0  # longer waits are mistakes (and overflow the OS's timers)
_TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@dataclass(frozen=True)
class LaunchConfig:
    """A validated launch: what `Job` needs to start and restart the ranks."""

    main: str  # "pkg.mod:function", imported in each child
    nproc_per_node: int  # ranks on this node
    cuda_devices: list[str] | None  # CUDA_VISIBLE_DEVICES value per local rank, None on CPU
    args_json: str  # the `args` passed to main, as JSON
    backend: str | None  # "nccl", "gloo", or None (no process group)
    timeout: float | None  # seconds for the whole job, restarts included
    log_dir: str  # per-rank logs, error files, results and job.json
    env: dict[str, str]  # extra environment variables for every rank
    nnodes: int  # launchers (nodes) in the job
    node_rank: int  # this launcher's node, in [0, nnodes)
    master_addr: str  # host of rank 0's rendezvous store
    master_port: int | None  # its port; None: a free port per attempt (one node only)
    max_restarts: int  # whole-group restarts after a failure
    grace_period: float  # seconds between SIGTERM and SIGKILL
    rdzv_timeout: float  # seconds the nodes wait for each other (nnodes > 1)
    collective_timeout: float  # seconds a rank waits in one collective before failing

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def global_rank(self, local_rank: int) -> int:
        return self.node_rank * self.nproc_per_node + local_rank

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["args"] = json.loads(data.pop("args_json"))
        data["world_size"] = self.world_size
        return data


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _name_defined(source_file: str, name: str) -> bool:
    """Whether a module's source binds `name` at top level (or may, through `import *`)."""
    try:
        tree = ast.parse(Path(source_file).read_text())
    except (OSError, SyntaxError, ValueError):
        return True  # the child will report what is wrong with the module itself
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(alias.name == "*" or (alias.asname or alias.name.split(".")[0]) == name for alias in node.names):
                return True
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store) and sub.id == name:
                return True
    return False


def main_target(main: str | Callable[..., Any]) -> str:
    """The entry point as "pkg.mod:function", checked to import (without running it).

    Raises:
        TypeError: `main` is neither a string nor a callable.
        ValueError: malformed, defined in __main__ or a local scope, or not importable.
    """
    if isinstance(main, str):
        if not _TARGET.match(main):
            raise ValueError(f"main must be 'package.module:function', got {main!r}")
        target = main
    elif callable(main) and hasattr(main, "__module__") and hasattr(main, "__qualname__"):
        qualname = main.__qualname__
        if "." in qualname or "<" in qualname:
            raise ValueError(
                f"main must be a module-level function, got {qualname!r} "
                "(a method, lambda or nested function cannot be imported by the ranks)"
            )
        if main.__module__ == "__main__":
            raise ValueError(
                f"main {qualname!r} is defined in __main__, which the ranks cannot "
                "import: move it to a module or pass 'package.module:function'"
            )
        target = f"{main.__module__}:{qualname}"
    else:
        raise TypeError(f"main must be 'package.module:function' or a module-level function, got {main!r}")
    module, name = target.split(":")
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        raise ValueError(f"main {target!r}: module {module!r} does not import ({exc})") from None
    if spec is None:
        raise ValueError(f"main {target!r}: no module named {module!r} on sys.path")
    loaded = sys.modules.get(module)
    if loaded is not None:
        if not callable(getattr(loaded, name, None)):
            raise ValueError(f"main {target!r}: module {module!r} has no function {name!r}")
    elif spec.origin and spec.origin.endswith(".py") and not _name_defined(spec.origin, name):
        raise ValueError(f"main {target!r}: module {module!r} defines no {name!r}")
    return target


def _args_json(args: Any) -> str:
    try:
        return json.dumps(args, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"args must be JSON-serializable (dict, list, str, number, bool, None), got {type(args).__name__}: {exc}"
        ) from None


def _env(env: Mapping[str, str] | None) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise TypeError(f"env must be a mapping of str to str, got {type(env).__name__}")
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"env must map str to str, got {key!r}: {value!r}")
    return dict(env)


def _check_numbers(kw: dict[str, Any], problems: list[str]) -> None:
    timeout, grace, restarts = kw["timeout"], kw["grace_period"], kw["max_restarts"]
    if timeout is not None and not (_is_number(timeout) and 0 < timeout <= MAX_SECONDS):
        problems.append(f"timeout must be None or seconds in (0, {MAX_SECONDS:.0f}] (a year), got {timeout!r}")
    for name in ("rdzv_timeout", "collective_timeout"):
        if not (_is_number(kw[name]) and 0 < kw[name] <= MAX_SECONDS):
            problems.append(f"{name} must be seconds in (0, {MAX_SECONDS:.0f}] (a year), got {kw[name]!r}")
    if not (_is_number(grace) and 0 <= grace <= MAX_SECONDS):
        problems.append(f"grace_period must be seconds in [0, {MAX_SECONDS:.0f}] (a year), got {grace!r}")
    if not (_is_int(restarts) and restarts >= 0):
        problems.append(f"max_restarts must be an integer >= 0, got {restarts!r}")
    if kw["backend"] not in BACKENDS:
        problems.append(f"backend must be one of 'auto', 'nccl', 'gloo' or None, got {kw['backend']!r}")


def check_nodes(kw: dict[str, Any], problems: list[str]) -> None:
    """The node layout (nnodes, node_rank, master_addr, master_port): each mistake named in `problems`."""
    nnodes, node_rank, port, addr = kw["nnodes"], kw["node_rank"], kw["master_port"], kw["master_addr"]
    if not (_is_int(nnodes) and nnodes >= 1):
        problems.append(f"nnodes must be an integer >= 1, got {nnodes!r}")
    elif not (_is_int(node_rank) and 0 <= node_rank < nnodes):
        problems.append(f"node_rank must be an integer in [0, {nnodes}) (nnodes), got {node_rank!r}")
    if port is not None and not (_is_int(port) and 1 <= port <= 65535):
        problems.append(f"master_port must be None or an integer in [1, 65535], got {port!r}")
    if _is_int(nnodes) and nnodes > 1 and port is None:
        problems.append(
            f"master_port is required when nnodes > 1 (got nnodes={nnodes}): every node must be given the same port"
        )
    if not (isinstance(addr, str) and addr):
        problems.append(f"master_addr must be a non-empty host name or address, got {addr!r}")


def _apply_slurm(kw: dict[str, Any]) -> None:
    """SLURM fills nnodes, node_rank, master_addr, master_port where they are at their defaults."""
    layout = layout_taken(kw["nnodes"], kw["node_rank"], os.environ)
    if layout is None:
        return
    kw["nnodes"], kw["node_rank"] = layout.nnodes, layout.node_rank
    if layout.nnodes > 1 and kw["master_addr"] == "127.0.0.1" and layout.master_addr:
        kw["master_addr"] = layout.master_addr
    if layout.nnodes > 1 and kw["master_port"] is None:
        kw["master_port"] = layout.master_port


def _check_log_dir(log_dir: Any, problems: list[str]) -> None:
    if log_dir is None:
        return
    if not isinstance(log_dir, (str, os.PathLike)):
        problems.append(f"log_dir must be None or a path, got {log_dir!r}")
    elif Path(log_dir).exists() and not Path(log_dir).is_dir():
        problems.append(f"log_dir must be a directory, got {str(log_dir)!r}, which is a file")


def build_config(main: Any, **kw: Any) -> LaunchConfig:
    """Check every launch argument and resolve defaults; see `clorch.launch.launch`.

    Raises:
        TypeError: `main`, `args` or `env` of the wrong type.
        ValueError: every other mistake, all listed in one message.
    """
    target = main_target(main)
    args_json = _args_json(kw["args"])
    env = _env(kw["env"])
    _apply_slurm(kw)
    problems: list[str] = []
    _check_numbers(kw, problems)
    check_nodes(kw, problems)
    _check_log_dir(kw["log_dir"], problems)
    nproc, devices, backend = resolve_ranks(
        kw["nproc_per_node"], kw["devices"], kw["backend"], {**os.environ, **env}, problems
    )
    if problems:
        raise ValueError("invalid launch arguments: " + "; ".join(problems))
    return LaunchConfig(
        main=target,
        nproc_per_node=nproc,
        cuda_devices=devices,
        args_json=args_json,
        backend=backend,
        timeout=None if kw["timeout"] is None else float(kw["timeout"]),
        log_dir="" if kw["log_dir"] is None else os.fspath(Path(kw["log_dir"]).absolute()),
        env=env,
        nnodes=kw["nnodes"],
        node_rank=kw["node_rank"],
        master_addr=kw["master_addr"],
        master_port=kw["master_port"],
        max_restarts=kw["max_restarts"],
        grace_period=float(kw["grace_period"]),
        rdzv_timeout=float(kw["rdzv_timeout"]),
        collective_timeout=float(kw["collective_timeout"]),
    )
