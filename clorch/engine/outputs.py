"""What a run leaves in its run directory.

    config.yaml      the resolved config            env.json      the environment record
    logs/            per-rank stdout/stderr          metrics.jsonl rank 0's metrics, one JSON a line
    checkpoints/     by checkpoint policy            summary.json  status, final/best metrics, throughput
    loss.png         the loss curve and the eval metrics (with matplotlib installed)
    events.jsonl     what happened on the way (a resume, a restart), when something did

This module is the launching process's part: the directory, env.json, loss.png and
rank 0's result file. metrics.jsonl and events.jsonl are written by the ranks, and read
here, through clorch.train.metrics.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import itertools
import logging
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from clorch._files import write_json_atomic
from clorch._version import __version__
from clorch.train.metrics import read_metrics


def new_run_dir(base: str | os.PathLike | None = None, layout: str = "outputs") -> Path:
    """Create and return a fresh `<layout>/DATE/TIME` directory (Hydra's layout) under `base`.

    The directory is made with one `os.mkdir`, which fails when it exists, so two
    runs that start in the same second (in one or several processes) never share
    it: the later one gets `TIME-1`, `TIME-2`, ...

    Args:
        base: the folder holding `<layout>/`; None: the current directory.
        layout: "outputs" for single runs, "multirun" for sweeps.

    Returns:
        The new, empty directory (absolute).
    """
    now = _dt.datetime.now()
    root = Path(base or os.getcwd()).resolve() / layout / now.strftime("%Y-%m-%d")
    root.mkdir(parents=True, exist_ok=True)  # shared by every run of the day
    stem = now.strftime("%H-%M-%S")
    for n in itertools.count():
        path = root / (f"{stem}-{n}" if n else stem)
        try:
            os.mkdir(path)  # atomic: exactly one process succeeds for each name
        except FileExistsError:
            continue
        return path
    raise AssertionError("unreachable")  # itertools.count() never ends


def write_json(path: Path, data: Any) -> None:
    """Write `data` as indented JSON through a temporary file (never a half-written file)."""
    write_json_atomic(path, data, indent=2, sort_keys=True, default=str)


def _git_commit(directory: Path) -> str | None:
    """The commit checked out where `directory` lies (any folder of a git checkout), else None."""
    try:
        out = subprocess.run(
            ["git", "-C", str(directory), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


# The command line as the user typed it, while `typed_command` holds it (innermost last).
_typed: list[list[str]] = []


@contextlib.contextmanager
def typed_command(argv: Sequence[str]) -> Iterator[None]:
    """Within: `env_record` records `argv` as the run's command line.

    `clorch-train` hands Hydra a rewritten `sys.argv` (recipe paths made overrides,
    flags first, the run directory it chose); env.json should say what the user
    typed, so the command line is given here before it is rewritten.
    """
    _typed.append(list(argv))
    try:
        yield
    finally:
        _typed.pop()


def env_record(argv: Iterable[str] | None = None) -> dict[str, Any]:
    """Python, clorch, torch, CUDA and NCCL versions, GPU names, git commits, host and command line.

    Args:
        argv: the command line to record; None: the one `typed_command` holds, else `sys.argv`.
    """
    # lazy: keeps torch out of clorch-train's start
    import torch

    cuda = torch.cuda.is_available()
    nccl = None
    if cuda:
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # torch built without NCCL
            nccl = None
    return {
        "python": sys.version.split()[0],
        "clorch": __version__,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": cuda,
        "nccl": nccl,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
        # The user's code: the checkout the run was started from; and clorch's own, when it runs
        # from a checkout (an editable install).
        "git_commit": _git_commit(Path.cwd()),
        "clorch_git_commit": _git_commit(Path(__file__).parent),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "command": _command(argv),
        "cwd": os.getcwd(),
        # As typed, when clorch-train recorded it (typed_command): what `clorch-runs show` re-runs.
        "argv": list(_typed[-1]) if argv is None and _typed else None,
        "time": _dt.datetime.now().isoformat(timespec="seconds"),
    }


def _command(argv: Iterable[str] | None) -> list[str]:
    if argv is not None:
        return list(argv)
    return command_line()


def command_line() -> list[str]:
    """The command line as typed (`typed_command`'s), else sys.argv."""
    return list(_typed[-1] if _typed else sys.argv)


@contextlib.contextmanager
def _quiet_matplotlib() -> Iterator[None]:
    """Within: matplotlib logs warnings only. Its first use logs "generated new fontManager"
    at INFO, which Hydra's console handler would show in the middle of clorch-train's output."""
    logger = logging.getLogger("matplotlib")
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)


def _eval_metrics(records: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """{"eval_NAME": [(step, value), ...]} for each number the evaluations recorded (no timing)."""
    series: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        if record.get("kind") != "eval":
            continue
        for key, value in record.items():
            if key.startswith("eval_") and isinstance(value, (int, float)) and not isinstance(value, bool):
                series.setdefault(key, []).append((record["step"], value))
    return series


def plot_loss(run_dir: Path) -> Path | None:
    """loss.png from metrics.jsonl, when matplotlib is installed (else None).

    The train and eval loss on a log scale; below them, in a second panel, the
    other eval metrics (eval_exact, ...), when the task reports any.
    """
    records = read_metrics(run_dir / "metrics.jsonl")
    train = [(r["step"], r["loss"]) for r in records if r.get("kind") == "train"]
    if not train:
        return None
    with _quiet_matplotlib():
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return None
        return _draw(run_dir / "loss.png", train, _eval_metrics(records), plt)


def _draw(out: Path, train: list[tuple[int, float]], evals: dict[str, list[tuple[int, float]]], plt: Any) -> Path:
    others = {k: v for k, v in evals.items() if k != "eval_loss"}
    rows = 2 if others else 1
    fig, axes = plt.subplots(rows, 1, figsize=(6, 4 * rows), sharex=True, squeeze=False)
    ax = axes[0][0]
    ax.plot(*zip(*train), label="train loss")
    if evals.get("eval_loss"):
        ax.plot(*zip(*evals["eval_loss"]), "o-", label="eval loss")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    ax.legend()
    if others:
        metrics = axes[1][0]
        for key, points in others.items():
            metrics.plot(*zip(*points), "o-", label=key.replace("_", " "))
        metrics.set_ylabel("eval metric")
        metrics.legend()
    axes[-1][0].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def rank0_result_path(run_dir: Path, launching_pid: int | None = None) -> Path:
    """Where rank 0 under launcher=torchrun leaves its result for the process that launched it.

    The name holds that process's host and pid: with several nodes sharing the run
    directory, only rank 0's own node finds it and writes the summary.
    """
    pid = os.getpid() if launching_pid is None else launching_pid
    return run_dir / f".rank0_result-{socket.gethostname()}-{pid}.json"
