"""What the tracker tests share: clorch-train's environment for MLflow and W&B under a test's
folder, and the records of a W&B offline run file."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path


def tracker_env(home: Path) -> dict[str, str]:
    """clorch-train's environment: W&B's settings, caches and temporary folders under `home`,
    offline; MLflow refuses a connection at once instead of retrying for minutes."""
    # wandb (on import) and torch's elastic agent make temporary folders that go at the process's
    # exit, which a process forked by tests.clirunner skips (it leaves through os._exit).
    (home / "tmp").mkdir(exist_ok=True)
    env = {
        **os.environ,
        "PYTHONWARNINGS": "ignore",
        "WANDB_MODE": "offline",
        "TMPDIR": str(home / "tmp"),
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
    }
    for name in ("CONFIG_DIR", "CACHE_DIR", "DATA_DIR", "ARTIFACT_DIR"):
        env[f"WANDB_{name}"] = str(home / "wandb-home" / name.lower())
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_PROJECT", "WANDB_DIR"):
        env.pop(name, None)  # the default store and project, whatever this machine's user has set
    return env


def wandb_records(path: Path):
    """The records of a .wandb file: LevelDB's log format (32 KiB blocks, 7-byte chunk headers)
    after W&B's 7-byte file header, each record a wandb_internal_pb2.Record."""
    from wandb.proto import wandb_internal_pb2

    data, pos, pending = path.read_bytes(), 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or kind == 0:  # a block's padding
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_records_once_written(path: Path, within_s: float = 20.0) -> list:
    """The .wandb file's records once its exit record is in: W&B's own process writes the file,
    and under load it may still be writing when finish() has returned."""
    deadline = time.monotonic() + within_s
    while True:
        records = list(wandb_records(path))
        if any(r.HasField("exit") for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)
