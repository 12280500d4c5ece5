"""What rank 0 writes into its run directory while it trains, and how it is read back.

    metrics.jsonl  one JSON object a line: each logged step, each evaluation (`MetricsWriter`)
    events.jsonl   what happened on the way (a resume, a restart), for the console (`announce`)

A run resumed from another run's checkpoint starts its metrics.jsonl with that
run's records up to the resumed step (`resumed_history`), so every run
directory holds its run's whole history. The launching process reads both files
(its progress view, summary.json, the trackers) through `read_metrics` and `EVENTS`;
the rest of the run directory is clorch.engine.outputs'.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from clorch._files import write_text_atomic

TIMING_KEYS = ("time_s", "samples_per_s", "tokens_per_s")


EVENTS = "events.jsonl"


def announce(run_dir: Path, message: str, **fields: Any) -> None:
    """Append one event for the console to the run's events.jsonl (rank 0, or the launching process).

    `clorch-train` shows each event as a `clorch: ...` line while the run goes on:
    a resume, a restart, a run that was already complete. `fields` are recorded
    with it (a resume names the run directory it continues, `resumed_run_dir`, and
    how many records of that run's metrics.jsonl it carried over, `carried_records`).
    """
    with open(Path(run_dir) / EVENTS, "a") as f:
        f.write(json.dumps({"time": time.time(), "message": message, **fields}) + "\n")


class MetricsWriter:
    """Appends one JSON object per line to metrics.jsonl (rank 0 only), flushed each line.

    Args:
        path: the metrics.jsonl file; what it held before is replaced.
        history: the records the file starts with: a resumed run's history up to the
            resumed step (`resumed_history`), so the file ends up as an uninterrupted
            run's would; None or []: a fresh file.
        tensorboard_dir: also write each number as a TensorBoard scalar there (the
            history too, when the directory is new: a resume into another run directory).
    """

    def __init__(self, path: Path, history: list[dict[str, Any]] | None = None, tensorboard_dir: Path | None = None):
        self.path = Path(path)
        # Atomic: the launching process follows this file while it is rewritten.
        write_text_atomic(self.path, "".join(json.dumps(r) + "\n" for r in history or []))
        self._file = open(self.path, "a")
        self._tb = None
        if tensorboard_dir is not None:
            # lazy: keeps torch out of clorch-train's start
            from torch.utils.tensorboard import SummaryWriter

            fresh = not Path(tensorboard_dir).exists()  # else it holds the history already
            self._tb = SummaryWriter(str(tensorboard_dir))
            if fresh:
                for record in history or []:
                    self._scalars(record)

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            self._scalars(record)

    def _scalars(self, record: dict[str, Any]) -> None:
        for key, value in record.items():
            if isinstance(value, (int, float)) and key != "step":
                self._tb.add_scalar(f"{record.get('kind', 'train')}/{key}", value, record["step"])

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def resumed_history(records: list[dict[str, Any]], step: int, last_step: int) -> list[dict[str, Any]]:
    """What a run resumed at `step` (of `last_step`) keeps of the metrics records before it.

    The records up to `step`: the steps after it (trained after the checkpoint
    was taken) are trained and logged again. A checkpoint at the last step
    evaluates again, so that step's evaluation is left to the resumed run.
    """

    def kept(record: dict[str, Any]) -> bool:
        at = record.get("step", 0)
        return at < step or (at == step and not (step >= last_step and record.get("kind") == "eval"))

    return [r for r in records if kept(r)]


def read_metrics(path: Path, skip_damaged: bool = False) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file ([] when it does not exist).

    Args:
        skip_damaged: leave out lines that are not JSON (a run killed while writing
            one) instead of raising ValueError.
    """
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError:
            if not skip_damaged:
                raise
    return records


def without_timing(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records minus wall-clock fields: what two identical runs must agree on."""
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]
