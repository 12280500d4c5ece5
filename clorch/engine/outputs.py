"""What a run leaves in its run directory.

    config.yaml      the resolved config            env.json      the environment record
    logs/            per-rank stdout/stderr          metrics.jsonl rank 0's metrics, one JSON a line
    checkpoints/     by checkpoint policy            summary.json  status, final/best metrics, throughput
    loss.png         the loss curve (with matplotlib installed)
"""

from __future__ import annotations

import datetime as _dt
import itertools
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable

from clorch._files import write_json_atomic

TIMING_KEYS = ("time_s", "samples_per_s", "tokens_per_s")


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


class Footprint:
    """What a launch adds around its run directory, so that a launch stopped by config errors
    (no run happened: nothing it wrote is anyone's work) can take it back.

    Record it before the launch writes anything; `undo` then removes the entries
    the launch added to the directory, the directory itself if it did not exist,
    and the empty parent directories made for it.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).expanduser().absolute()
        self.entries = set(os.listdir(self.path)) if self.path.is_dir() else None
        self.new_parents: list[Path] = []  # nearest first
        parent = self.path.parent
        while not parent.exists():
            self.new_parents.append(parent)
            parent = parent.parent

    def made(self, path: Path) -> "Footprint":
        """The same record for `path`, a new directory made inside the recorded one's parent."""
        self.path, self.entries = path, None
        return self

    def undo(self) -> None:
        """Remove what the launch added (local file operations; errors are ignored)."""
        if self.entries is None:
            shutil.rmtree(self.path, ignore_errors=True)
        elif self.path.is_dir():
            for name in set(os.listdir(self.path)) - self.entries:
                entry = self.path / name
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
        for parent in self.new_parents:
            try:
                parent.rmdir()  # only while empty: the first one in use stops the climb
            except OSError:
                break


def write_json(path: Path, data: Any) -> None:
    """Write `data` as indented JSON through a temporary file (never a half-written file)."""
    write_json_atomic(path, data, indent=2, sort_keys=True, default=str)


def _git_commit(directory: Path) -> str | None:
    """The commit checked out where `directory` lies (any folder of a git checkout), else None."""
    try:
        out = subprocess.run(["git", "-C", str(directory), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def env_record(argv: Iterable[str] | None = None) -> dict[str, Any]:
    """Python, torch, CUDA and NCCL versions, GPU names, git commit, host and command line."""
    import torch

    cuda = torch.cuda.is_available()
    nccl = None
    if cuda:
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # torch built without NCCL
            nccl = None
    return {
        "python": sys.version.split()[0], "torch": torch.__version__,
        "cuda": torch.version.cuda, "cuda_available": cuda, "nccl": nccl,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
        # The user's code: the checkout the run was started from; and clorch's own, when it runs
        # from a checkout (an editable install).
        "git_commit": _git_commit(Path.cwd()), "clorch_git_commit": _git_commit(Path(__file__).parent),
        "host": socket.gethostname(), "platform": platform.platform(),
        "command": list(sys.argv if argv is None else argv), "cwd": os.getcwd(),
        "time": _dt.datetime.now().isoformat(timespec="seconds"),
    }


EVENTS = "events.jsonl"


def announce(run_dir: Path, message: str) -> None:
    """Append one event for the console to the run's events.jsonl (rank 0, or the launching process).

    `clorch-train` shows each event as a `clorch: ...` line while the run goes on:
    a resume, a restart, a run that was already complete.
    """
    with open(Path(run_dir) / EVENTS, "a") as f:
        f.write(json.dumps({"time": time.time(), "message": message}) + "\n")


class MetricsWriter:
    """Appends one JSON object per line to metrics.jsonl (rank 0 only), flushed each line.

    Resuming into the same run directory first drops the lines after the resumed
    step, so the file ends up as an uninterrupted run's would.
    """

    def __init__(self, path: Path, keep_until_step: int | None = None, tensorboard_dir: Path | None = None):
        self.path = Path(path)
        if keep_until_step is not None and self.path.exists():
            kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= keep_until_step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        elif keep_until_step is None and self.path.exists():
            self.path.unlink()
        self._file = open(self.path, "a")
        self._tb = None
        if tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(tensorboard_dir))

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key != "step":
                    self._tb.add_scalar(f"{record.get('kind', 'train')}/{key}", value, record["step"])

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file ([] when it does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def without_timing(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records minus wall-clock fields: what two identical runs must agree on."""
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


def plot_loss(run_dir: Path) -> Path | None:
    """loss.png from metrics.jsonl, when matplotlib is installed (else None)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    records = read_metrics(run_dir / "metrics.jsonl")
    train = [(r["step"], r["loss"]) for r in records if r.get("kind") == "train"]
    held_out = [(r["step"], r["eval_loss"]) for r in records if "eval_loss" in r]
    if not train:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(*zip(*train), label="train loss")
    if held_out:
        ax.plot(*zip(*held_out), "o-", label="eval loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    out = run_dir / "loss.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
