"""Count one setting's walk from the command line to the code that uses it.

    python scripts/walk/count.py ddp.bucket_cap_mb=1.37 --end nn/parallel/buckets.py:plan_buckets
    python scripts/walk/count.py precision=fp16 --mark fp16 --end amp/scaler.py:update

runs `clorch-train +recipe=cpu_smoke <override>` (as `python -m clorch.cli`: 2 CPU ranks,
4 steps) with every process recording the calls that carry the value (sitecustomize.py beside
this file), then prints the walk and its two figures: hand-offs (clorch functions the value
passes through: once per function and process) and files.

A call is on the walk when it carries the value (in its arguments or what it returns) and
hands it on: it is where the value is used, a call on the walk runs inside it, it returned an
object a call on the walk received, or it built part of what such a call returned (objects
are matched by identity). A check that reads the value and returns something else is not on
it. In the launching process the walk ends at the write of a file that a rank reads and that
holds the value; in a rank, at `--end` (its first call). WALK_DEBUG=1 prints why each call is
on the walk.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass
class Call:
    name: str  # file.py:function, under clorch/
    seq: int  # its place in the process's record
    stack: list[int] = field(default_factory=list)  # the seqs of the recorded calls it runs inside
    args: list[list[int]] = field(default_factory=list)  # its arguments that carry the value: their ids
    # and the ids of what each holds that carries it
    returned: list[int] = field(default_factory=list)  # ids of what it returned (and what that holds)
    returned_at: int = 0  # the seq of its return
    end: bool = False


@dataclass
class Process:
    calls: dict[int, Call] = field(default_factory=dict)
    returns: list[Call] = field(default_factory=list)  # the calls whose result carries, in order
    writes: list[tuple[str, list[int | None]]] = field(default_factory=list)  # (path, the calls above)
    reads: list[str] = field(default_factory=list)
    renamed: dict[str, str] = field(default_factory=dict)


def read_process(path: Path) -> Process:
    """One process's record: its calls, with each frame id resolved to the call it belonged to."""
    process, live, frames = Process(), {}, {}
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for record in records:
        if "call" in record:
            call = Call(record["call"], record["seq"], record["stack"], record["args"], end=record["end"])
            live[record["frame"]] = process.calls[call.seq] = call
        elif "return" in record:
            call = live.pop(record["frame"], None)
            if call is None or call.name != record["return"]:  # the value came back, not in
                if not record["ids"]:
                    continue
                call = Call(record["return"], record["seq"], record["stack"])
                process.calls[call.seq] = call
            call.returned, call.returned_at = record["ids"], record["seq"]
            if call.returned:
                process.returns.append(call)
            frames.setdefault(record["frame"], []).append(call)
        elif "write" in record:
            process.writes.append((record["write"], record["stack"], record["seq"]))
        elif "read" in record:
            process.reads.append(record["read"])
        else:
            process.renamed[record["rename"]] = record["to"]
    for frame, call in live.items():  # still running when the process ended (or exited early)
        frames.setdefault(frame, []).append(call)

    def above(ids: list[int], seq: int) -> list[int | None]:
        """The calls running at `seq` in the frames `ids` (None for a frame with no record)."""
        out: list[int | None] = []
        for frame in ids:
            running = [c for c in frames.get(frame, []) if c.seq <= seq or not c.args]
            running = [c for c in running if (c.returned_at or 1 << 62) >= seq]
            out.append(min(running, key=lambda c: c.returned_at or 1 << 62).seq if running else None)
        return out

    for call in process.calls.values():
        call.stack = [s for s in above(call.stack, call.seq) if s is not None]
    process.writes = [(path, above(ids, seq)) for path, ids, seq in process.writes]
    return process


def walk(process: Process, ends: list[Call]) -> list[Call]:
    """The calls the value passes through on its way to `ends`, first call of each function.

    A call is on the walk when it carries the value and: it is an end; a call on the walk runs
    inside it; it returned an argument of a call on the walk; or it runs inside a call that is
    on the walk for that reason and returned something that call returned.
    """
    last = max(c.seq for c in ends)  # what runs after the value has left or arrived is not on it
    chosen, todo = {}, [(c, "end") for c in ends]
    while todo:
        call, why = todo.pop()
        if call.seq in chosen or call.seq > last:
            continue
        if os.environ.get("WALK_DEBUG"):
            print("  ", call.name, why, file=sys.stderr)
        chosen[call.seq] = call
        todo += [(process.calls[s], f"runs {call.name}") for s in call.stack if process.calls[s].args]
        for arg in call.args:
            ids = set(arg)
            producer = next(
                (r for r in reversed(process.returns) if r.returned_at < call.seq and ids & set(r.returned)), None
            )
            if producer is not None:
                todo.append((producer, f"made an argument of {call.name}"))
        if call.returned and call.returned_at <= last:
            kept = set(call.returned)
            todo += [
                (r, f"made what {call.name} returned")
                for r in process.returns
                if call.seq in r.stack and r.returned_at < call.returned_at and kept & set(r.returned)
            ]

    def started(call: Call) -> tuple[int, int]:
        """Where the call began: its own record, or (recorded only at its return) before its first inner call."""
        if call.args or call.end:
            return call.seq, 1
        return min([c.seq for c in process.calls.values() if call.seq in c.stack] + [call.seq]), 0

    seen, out = set(), []
    for call in sorted(chosen.values(), key=started):
        if call.name not in seen:
            seen.add(call.name)
            out.append(call)
    return out


def _holds(path: str, mark: str, read: set[str]) -> bool:
    """Whether a rank read the file at `path` and it holds the value (as text, or as a pickled float)."""
    forms = [mark.encode()]
    try:
        forms.append(struct.pack(">d", float(mark)))  # pickle's BINFLOAT
    except ValueError:
        pass
    try:
        return path in read and any(form in Path(path).read_bytes() for form in forms)
    except OSError:
        return False


def _final(path: str, renamed: dict[str, str]) -> str:
    while path in renamed:
        path = renamed[path]
    return path


def run(override: str, mark: str, end: str, workdir: Path) -> list[tuple[str, list[Call]]]:
    """Run the job, then the walk in the launching process and in one rank."""
    env = dict(os.environ, WALK_MARK=mark, WALK_DIR=str(workdir), WALK_END=end)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "clorch.cli", "+recipe=cpu_smoke", override, f"hydra.run.dir={workdir / 'run'}"]
    subprocess.run(command, env=env, check=True, cwd=workdir)
    processes = [read_process(p) for p in sorted(workdir.glob("walk.*.jsonl"))]
    ranks = [p for p in processes if any(c.end for c in p.calls.values())]
    launching = [p for p in processes if any(c.name.startswith("cli/") for c in p.calls.values())]
    if not ranks or not launching:
        raise SystemExit(f"no rank reached {end}, or no launching process was recorded")
    rank, launcher = ranks[0], launching[0]
    rank_end = min((c for c in rank.calls.values() if c.end), key=lambda c: c.seq)
    # Where the value leaves the launching process: the writes of files the rank reads.
    read = set(rank.reads)
    exits = [
        launcher.calls[next(s for s in seqs if s is not None)]
        for path, seqs in launcher.writes
        if _holds(_final(path, launcher.renamed), mark, read) and any(s is not None for s in seqs)
    ]
    if os.environ.get("WALK_DEBUG"):
        for path, seqs in launcher.writes:
            if seqs and _final(path, launcher.renamed) in read:
                print("exit", path, seqs, file=sys.stderr)
    # What an exit wrote may have been made just before it, by its caller (a plan turned into
    # plain values, then into text by json.dumps, which is not clorch's and so not recorded).
    callers = {e.stack[0]: e.seq for e in exits if e.stack}
    exits += [r for r in launcher.returns if r.stack and r.returned_at < callers.get(r.stack[0], 0)]
    return [("launching process", walk(launcher, exits)), ("rank", walk(rank, [rank_end]))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("override", help="the setting, as clorch-train takes it: ddp.bucket_cap_mb=1.37")
    parser.add_argument("--mark", help="the value to follow (default: the override's value)")
    parser.add_argument("--end", required=True, help="where the value is used: file.py:function under clorch/")
    options = parser.parse_args()
    mark = options.mark or options.override.partition("=")[2]
    with tempfile.TemporaryDirectory(prefix="clorch-walk-") as workdir:
        parts = run(options.override, mark, options.end, Path(workdir))
    files, handoffs = set(), 0
    for title, calls in parts:
        print(f"{title}:")
        for call in calls:
            print(f"  {call.name}")
            files.add(call.name.partition(":")[0])
        handoffs += len(calls)
    print(f"{options.override}: {handoffs} hand-offs through {len(files)} files")


if __name__ == "__main__":
    sys.exit(main())
