"""`clorch-bench allreduce`: clorch.distributed.all_reduce against raw torch.distributed.all_reduce.

For each size, the two are timed in alternating rounds (A B, B A, ...) on the
same buffer, after warm-up. Reported per size: median time per call, algbw
(bytes / time) and busbw (algbw x 2(n-1)/n, as nccl-tests define it) for both,
and the ratio raw_time / clorch_time (>= 1 means clorch is as fast; the goal is
>= 0.97 from 1 MiB up: the wrapper should cost nothing). Then the wrapper's own
time per call, measured directly with the collective stubbed out (goal <= 2 us).

Run it as `clorch-bench allreduce` (starts its own ranks with clorch's
launcher) or under torchrun: `torchrun --nproc-per-node 2 -m clorch.bench.allreduce`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

import clorch.distributed as cd
from clorch.bench.stats import format_table, human_bytes, median
from clorch.distributed import collectives

DEFAULT_SIZES = [4 * 4**k for k in range(14)]  # 4 B ... 256 MiB


def _parse_size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower().removesuffix("ib").removesuffix("b")
    scale = units.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in units else text
    try:
        value = int(float(number) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes: cannot read {text!r}; use e.g. 4, 64K, 1M, 256M") from None
    if value < 4 or value % 4:
        raise argparse.ArgumentTypeError(f"--sizes: {value} B must be a multiple of 4 B (float32 elements)")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="clorch-bench allreduce", description=__doc__.splitlines()[0])
    p.add_argument(
        "--sizes",
        type=_parse_size,
        nargs="+",
        default=None,
        help="message sizes in bytes (suffix K/M/G allowed); default 4 B to 256 MiB by x4",
    )
    p.add_argument("--min-size", type=_parse_size, default=None, help="drop default sizes below this")
    p.add_argument("--max-size", type=_parse_size, default=None, help="drop default sizes above this")
    p.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    p.add_argument("--nproc", type=int, default=2, help="ranks to launch when not run under a launcher")
    p.add_argument("--rounds", type=int, default=7, help="alternating rounds per size")
    p.add_argument(
        "--target-seconds", type=float, default=0.02, help="minimum time one timed batch of calls should take"
    )
    return p


def _sync() -> None:
    if cd.backend() == "nccl":
        torch.cuda.synchronize()


def _batch_time(call, buf: torch.Tensor, iters: int) -> float:
    cd.barrier()
    _sync()
    start = time.perf_counter()
    for _ in range(iters):
        call(buf)
    _sync()
    return (time.perf_counter() - start) / iters


def _iterations(buf: torch.Tensor, target: float) -> int:
    """Calls per timed batch so a batch lasts about `target` seconds; the same on every rank.

    One untimed call first, so the estimate never includes the communicator's lazy
    set-up (that would give a single call per batch at the first, smallest size).
    Large messages (a 4 GiB call takes ~10 ms over NVLink) get 1 call per batch.
    """
    _batch_time(lambda t: dist.all_reduce(t), buf, 1)
    one = _batch_time(lambda t: dist.all_reduce(t), buf, 2)
    iters = torch.tensor([max(1, min(1000, int(target / max(one, 1e-7))))], dtype=torch.int64)
    if cd.backend() == "nccl":
        iters = iters.cuda()
    dist.all_reduce(iters, op=dist.ReduceOp.MAX)
    return int(iters.item())


def measure(size: int, rounds: int, target: float) -> dict[str, float]:
    """Median seconds per call for clorch and raw at one size. Every rank calls it."""
    buf = torch.randn(size // 4, device=cd.device())
    calls = {"clorch": lambda t: cd.all_reduce(t), "raw": lambda t: dist.all_reduce(t)}
    iters = _iterations(buf, target)
    for call in calls.values():
        _batch_time(call, buf, 1)  # warm-up
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(rounds):
        order = list(calls) if r % 2 == 0 else list(reversed(calls))
        for name in order:
            samples[name].append(_batch_time(calls[name], buf, iters))
    return {name: median(values) for name, values in samples.items()}


class _StubCollectives:
    """torch.distributed as clorch's collectives see it, with all_reduce doing nothing.

    Its attributes are copied, not forwarded, so that looking one up costs what it
    costs on the real module."""

    def __init__(self) -> None:
        self.__dict__.update({name: getattr(dist, name) for name in dir(dist) if not name.startswith("__")})
        self.all_reduce = lambda *args, **kwargs: None


def wrapper_time(buf: torch.Tensor, calls: int = 20000, repeats: int = 7) -> float:
    """Seconds per call of clorch.distributed.all_reduce's own work (argument checks, op and
    device resolution, dispatch), the collective itself stubbed out: best of `repeats`.

    Measured on this rank alone; no communication happens while it runs.
    """
    real = collectives.dist
    collectives.dist = _StubCollectives()  # type: ignore[assignment]
    try:
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(calls):
                cd.all_reduce(buf)
            best = min(best, (time.perf_counter() - start) / calls)
        return best
    finally:
        collectives.dist = real


def rows_for(results: dict[int, dict[str, float]], world_size: int) -> list[list[object]]:
    factor = 2 * (world_size - 1) / world_size
    rows = []
    for size, times in results.items():
        algbw = {name: size / t / 1e9 for name, t in times.items()}
        rows.append(
            [
                human_bytes(size),
                times["clorch"] * 1e6,
                times["raw"] * 1e6,
                algbw["clorch"],
                algbw["clorch"] * factor,
                algbw["raw"] * factor,
                times["raw"] / times["clorch"],
            ]
        )
    return rows


HEADERS = [
    "size",
    "clorch us",
    "raw us",
    "clorch algbw GB/s",
    "clorch busbw GB/s",
    "raw busbw GB/s",
    "ratio raw/clorch",
]


def worker(ctx: dict) -> str:
    """Per-rank body: every rank measures every size; rank 0's table is returned."""
    opts = ctx["args"]
    results = {size: measure(size, opts["rounds"], opts["target_seconds"]) for size in opts["sizes"]}
    n = cd.world_size()
    title = f"all_reduce, {n} ranks, backend {cd.backend()}, float32, median of {opts['rounds']} rounds"
    table = title + "\n" + format_table(HEADERS, rows_for(results, n))
    own = wrapper_time(torch.zeros(1, device=cd.device()))
    table += (
        f"\nclorch wrapper's own time per call (checks and dispatch, the collective stubbed out, "
        f"best of 7 x 20000 calls): {own * 1e6:.2f} us"
    )
    if cd.rank() == 0:
        print(table, flush=True)
    return table


def _options(argv: list[str]) -> dict:
    args = parser().parse_args(argv)
    sizes = args.sizes or [
        s
        for s in DEFAULT_SIZES
        if (args.min_size is None or s >= args.min_size) and (args.max_size is None or s <= args.max_size)
    ]
    if not sizes:
        raise SystemExit("clorch-bench allreduce: no sizes left after --min-size/--max-size")
    if args.rounds < 1 or args.nproc < 1:
        raise SystemExit("clorch-bench allreduce: --rounds and --nproc must be >= 1")
    return {
        "sizes": sizes,
        "rounds": args.rounds,
        "target_seconds": args.target_seconds,
        "backend": args.backend,
        "nproc": args.nproc,
    }


def main(argv: list[str] | None = None) -> int:
    opts = _options(sys.argv[1:] if argv is None else argv)
    if "RANK" in os.environ:  # already a rank (torchrun, or clorch's launcher)
        with cd.process_group(backend=opts["backend"]):
            worker({"args": opts})
        return 0
    job = cd.launch("clorch.bench.allreduce:worker", nproc_per_node=opts["nproc"], backend=opts["backend"], args=opts)
    status = job.wait()
    if status["state"] != "succeeded":
        print(f"benchmark failed: {status}", file=sys.stderr)
        print(cd.job_logs(job, 0)["stderr"], file=sys.stderr)
        return 1
    print(status["results"][0] if isinstance(status["results"], list) else status["results"]["0"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
