"""`clorch-bench launch`: time from starting a job to every rank having finished its first all_reduce.

clorch's `launch()` against `torchrun --standalone --nproc-per-node N` (run as
`python -m torch.distributed.run`), both running the same worker on CPU ranks
with gloo, interleaved round by round. Each rank writes the wall-clock time
right after its first all_reduce; a run's time is the latest of those minus
the moment the launch was requested.

    clorch-bench launch [--rounds 5] [--nproc-per-node 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from clorch.bench.stats import format_table, interleave, median, ratio
from clorch.env import with_multicast_off
from clorch.launch import launch


def _first_all_reduce(rank: int, stamp_dir: str) -> None:
    # lazy: keeps torch out of clorch-bench's start
    import torch

    # lazy: clorch.distributed imports torch, kept out of clorch-bench's start
    from clorch.distributed import all_reduce

    all_reduce(torch.randn(1024))
    Path(stamp_dir, f"rank_{rank}").write_text(repr(time.time()))


def worker(ctx: dict[str, Any]) -> None:
    """The clorch entry point: the group is already initialized by the launcher."""
    _first_all_reduce(ctx["rank"], ctx["args"]["stamp_dir"])


def _torchrun_worker(stamp_dir: str) -> None:
    """The torchrun entry point: the same work, joining the group from the environment."""
    # lazy: clorch.distributed imports torch, kept out of clorch-bench's start
    from clorch.distributed import process_group, rank

    with process_group(backend="gloo"):
        _first_all_reduce(rank(), stamp_dir)


def _elapsed(start: float, stamp_dir: Path, nproc: int) -> float:
    stamps = [float((stamp_dir / f"rank_{r}").read_text()) for r in range(nproc)]
    return max(stamps) - start


def _run_clorch(nproc: int) -> float:
    work = Path(tempfile.mkdtemp(prefix="clorch-bench-launch-"))
    try:
        start = time.time()
        job = launch(
            "clorch.bench.launch:worker",
            nproc_per_node=nproc,
            backend="gloo",
            args={"stamp_dir": str(work)},
            log_dir=work / "logs",
            timeout=300,
        )
        status = job.wait()
        if status["state"] != "succeeded":
            raise RuntimeError(f"clorch job failed: {status['error']}\n{job.logs(0)['stderr'][-2000:]}")
        return _elapsed(start, work, nproc)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_torchrun(nproc: int) -> float:
    work = Path(tempfile.mkdtemp(prefix="clorch-bench-torchrun-"))
    try:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            "-m",
            "clorch.bench.launch",
            "--worker",
            str(work),
        ]
        start = time.time()
        # TMPDIR: torchrun's scratch directories go with the work dir.
        env = with_multicast_off({**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(work)})
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"torchrun failed ({done.returncode}):\n{done.stderr[-2000:]}")
        return _elapsed(start, work, nproc)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="clorch-bench launch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--nproc-per-node", type=int, default=2, help="CPU ranks (default 2)")
    parser.add_argument("--worker", metavar="STAMP_DIR", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.worker:
        _torchrun_worker(options.worker)
        return 0
    if options.rounds < 1 or options.nproc_per_node < 1:
        parser.error(f"--rounds and --nproc-per-node must be >= 1, got {options.rounds} and {options.nproc_per_node}")
    nproc = options.nproc_per_node
    samples = interleave(
        {"clorch launch": lambda: _run_clorch(nproc), "torchrun": lambda: _run_torchrun(nproc)}, options.rounds
    )
    rows = [[name, median(values), min(values), max(values), len(values)] for name, values in samples.items()]
    print(f"time to the first all_reduce on every rank, {nproc} CPU ranks (gloo), seconds")
    print(format_table(["launcher", "median", "min", "max", "rounds"], rows))
    print(f"ratio clorch/torchrun (median): {ratio(median(samples['clorch launch']), median(samples['torchrun'])):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
