"""Rank 0's progress, shown by the launching process while the job runs.

The ranks' stdout goes to log files, so the launching process follows rank
0's metrics.jsonl instead: a tqdm bar with loss and throughput on a terminal,
a plain line per metrics record otherwise (progress=lines), nothing with
progress=off.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


class Progress:
    """Follows metrics.jsonl; call `poll()` periodically and `close()` at the end."""

    def __init__(self, metrics_path: Path, total_steps: int, mode: str = "auto", stream: Any = None):
        self.path, self.total = metrics_path, total_steps
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if getattr(self.stream, "isatty", lambda: False)() else "lines"
        self.mode = mode
        self._offset = 0  # bytes of metrics.jsonl already read
        self._shown: dict[str, int] = {}  # kind -> the highest step shown
        self._skip_until: dict[str, int] = {}  # after a rewrite: kind -> steps shown before it
        self._bar = None
        if mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, unit="step", file=self.stream, dynamic_ncols=True)

    def _new_records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            size = f.seek(0, 2)
            if size < self._offset or not self._at_line_start(f):
                # A restart rewrites metrics.jsonl up to the resumed step: read it again
                # from the top, leaving out the steps already shown.
                self._offset, self._skip_until = 0, dict(self._shown)
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # only whole lines; the rest is still being written
        self._offset += end
        records = []
        for line in data[:end].decode("utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a damaged line is not worth stopping the run's view for
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                continue
            kind = record.get("kind", "train")
            if record["step"] <= self._skip_until.get(kind, -1):
                continue
            self._shown[kind] = max(self._shown.get(kind, -1), record["step"])
            records.append(record)
        return records

    def _at_line_start(self, f: Any) -> bool:
        """Whether the byte before the offset still ends a line (false after a rewrite)."""
        if self._offset == 0:
            return True
        f.seek(self._offset - 1)
        return f.read(1) == b"\n"

    def poll(self) -> None:
        """Show the records written since the last call."""
        if self.mode == "off":
            return
        for record in self._new_records():
            self._show(record)

    def _show(self, record: dict[str, Any]) -> None:
        if self._bar is not None:
            self._bar.update(max(0, record["step"] - self._bar.n))
            shown = {k: f"{v:.4g}" for k, v in record.items()
                     if k in ("loss", "eval_loss", "eval_exact", "samples_per_s") and v is not None}
            self._bar.set_postfix(shown, refresh=True)
            return
        parts = [f"step {record['step']}/{self.total}"]
        for key in ("loss", "lr", "eval_loss", "eval_exact", "samples_per_s", "tokens_per_s"):
            if record.get(key) is not None:
                parts.append(f"{key} {record[key]:.4g}")
        print("  ".join(parts), file=self.stream, flush=True)

    def close(self) -> None:
        self.poll()
        if self._bar is not None:
            self._bar.close()
