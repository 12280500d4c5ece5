"""Rank 0's progress, shown by the launching process while the job runs.

The ranks' stdout goes to log files, so the launching process follows rank
0's metrics.jsonl instead: a tqdm bar with loss and throughput on a terminal,
a plain line per metrics record otherwise (progress=lines), nothing with
progress=off. Events (events.jsonl: a resume, a restart) appear as
`clorch: ...` lines. A console that goes away (`| head`, a `tee` ended by
Ctrl-C) is ignored: see clorch.launch.console. A run resumed from another
run's checkpoint starts metrics.jsonl with that run's records (its
announcement says how many): those are not shown again.

`poll()` also returns the records it read, each once (carried-over ones
included, steps already returned before a restart rewrote the file left out):
the launching process forwards them to the run's experiment trackers
(clorch.engine.tracking), so metrics.jsonl is parsed in one place.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from clorch.train.metrics import EVENTS
from clorch.launch.console import safe


def _sized_terminal(stream: Any) -> bool:
    """A terminal that reports a width: a bar needs one (a pty made without a size has 0 columns)."""
    if not getattr(stream, "isatty", lambda: False)():
        return False
    try:
        return os.get_terminal_size(stream.fileno()).columns > 0
    except (AttributeError, OSError, ValueError):
        return False


class Progress:
    """Follows metrics.jsonl; call `poll()` periodically and `close()` at the end.

    With mode "off" nothing is shown, but the files are still read (`poll` returns the records).
    """

    def __init__(self, metrics_path: Path, total_steps: int, mode: str = "auto", stream: Any = None):
        self.path, self.total = metrics_path, total_steps
        # Safe: a console that goes away (| head, a tee ended by Ctrl-C) must not end the run.
        self.stream = safe(stream or sys.stderr)
        if mode == "auto":
            mode = "bar" if _sized_terminal(self.stream) else "lines"
        self.mode = mode
        self._offset = 0  # bytes of metrics.jsonl already read
        events = metrics_path.parent / EVENTS  # what an earlier run in this directory announced is old
        self._events_offset = events.stat().st_size if events.exists() else 0
        self._shown: dict[str, int] = {}  # kind -> the highest step shown
        self._skip_until: dict[str, int] = {}  # after a rewrite: kind -> steps shown before it
        self._carried = 0  # the first records of the file, carried over from an earlier run
        self._index = 0  # the next record's position in the file
        self._bar = None
        if mode == "bar":
            self._bar = tqdm(total=total_steps, unit="step", file=self.stream, dynamic_ncols=True)

    def _read_records(self) -> list[Any]:
        """The JSON values of the lines written since the last read."""
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            size = f.seek(0, 2)
            if size < self._offset or not self._at_line_start(f):
                # A restart rewrites metrics.jsonl up to the resumed step: read it again
                # from the top, leaving out the steps already shown.
                self._offset, self._index, self._skip_until = 0, 0, dict(self._shown)
            f.seek(self._offset)
            data = f.read()
        values, used = _json_lines(data)
        self._offset += used
        return values

    def _new_records(self, values: list[Any]) -> list[tuple[dict[str, Any], bool]]:
        """The records of `values` not returned before, each with whether it is carried over."""
        records = []
        for record in values:
            self._index += 1
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                continue
            kind = record.get("kind", "train")
            if record["step"] <= self._skip_until.get(kind, -1):
                continue  # returned before the restart rewrote the file
            self._shown[kind] = max(self._shown.get(kind, -1), record["step"])
            # Announced as carried over from an earlier run: part of this run's history, not trained now.
            records.append((record, self._index <= self._carried))
        return records

    def _at_line_start(self, f: Any) -> bool:
        """Whether the byte before the offset still ends a line (false after a rewrite)."""
        if self._offset == 0:
            return True
        f.seek(self._offset - 1)
        return f.read(1) == b"\n"

    def poll(self) -> list[dict[str, Any]]:
        """Show the events and records written since the last call; return those records.

        The records carried over from an earlier run are returned but not shown; after
        a restart rewrote metrics.jsonl, the steps returned before are not returned again.
        """
        messages = self._new_events()
        values = self._read_records()
        # Events again: a resume announces its carried records before writing them, so
        # once those records are read here, their announcement is too.
        messages += self._new_events()
        for message in messages:
            self.note(message)
        records = self._new_records(values)
        for record, carried in records:
            if not carried:
                self._show(record)
        return [record for record, _ in records]

    def _show(self, record: dict[str, Any]) -> None:
        if self.mode == "off":
            return
        if self._bar is not None:
            self._bar.update(max(0, record["step"] - self._bar.n))
            shown = {k: f"{record[k]:.4g}" for k in _shown_keys(record, _BAR_KEYS)}
            self._bar.set_postfix(shown, refresh=True)
            return
        parts = [f"step {record['step']}/{self.total}"]
        parts += [f"{key} {record[key]:.4g}" for key in _shown_keys(record, _LINE_KEYS)]
        if record.get("skipped_steps"):  # fp16: steps the scaler skipped so far (overflow)
            parts.append(f"skipped_steps {record['skipped_steps']}")
        print("  ".join(parts), file=self.stream, flush=True)

    def note(self, message: str) -> None:
        """Show one `clorch: ...` line (above the bar, if there is one)."""
        if self.mode == "off":
            return
        if self._bar is not None:
            self._bar.write(f"clorch: {message}", file=self.stream)
        else:
            print(f"clorch: {message}", file=self.stream, flush=True)

    def _new_events(self) -> list[str]:
        path = self.path.parent / EVENTS
        if not path.exists():
            return []
        with open(path, "rb") as f:
            f.seek(self._events_offset)
            values, used = _json_lines(f.read())
        self._events_offset += used
        events = [v for v in values if isinstance(v, dict) and "message" in v]
        for event in events:
            if isinstance(event.get("carried_records"), int):
                self._carried = event["carried_records"]
        return [str(v["message"]) for v in events]

    def close(self) -> list[dict[str, Any]]:
        """Show and return what is left to read (as `poll`), and close the bar."""
        records = self.poll()
        if self._bar is not None:
            self._bar.close()
        return records


# The numbers shown of each record, in this order; every eval metric (eval_*: eval_loss,
# eval_exact, a metric of your own eval function) goes where "eval_" stands.
_BAR_KEYS = ("loss", "eval_", "samples_per_s")
_LINE_KEYS = ("loss", "grad_norm", "lr", "loss_scale", "eval_", "samples_per_s", "tokens_per_s")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shown_keys(record: dict[str, Any], keys: tuple[str, ...]) -> list[str]:
    """The keys of `record` to show, in the order of `keys`: the numbers among them."""
    shown = []
    for key in keys:
        if key == "eval_":
            shown += [k for k in record if k.startswith("eval_") and _is_number(record[k])]
        elif _is_number(record.get(key)):
            shown.append(key)
    return shown


def _json_lines(data: bytes) -> tuple[list[Any], int]:
    """The JSON values of the whole lines in `data`, and how many bytes those lines span.

    A last line without its newline is still being written: it is left for the next
    read. A damaged line is skipped; it is not worth stopping the run's view for.
    """
    end = data.rfind(b"\n") + 1
    values = []
    for line in data[:end].decode("utf-8", errors="replace").splitlines():
        try:
            values.append(json.loads(line))
        except ValueError:
            continue
    return values, end
