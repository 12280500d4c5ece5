"""`clorch-bench ddp`: clorch's DDP reducer vs torch's DDP vs one process without communication.

Per rank, the same MLP (about 6M parameters by default) and the same batches
train under four candidates, interleaved round by round (the order rotates):
clorch's DistributedDataParallel, clorch's with reduce_dtype="bf16", torch's
DistributedDataParallel with the same bucket cap, and the bare model (no
communication: what one process would cost). A candidate's sample is the mean
step time (forward, backward, reduction, SGD step, zero_grad) of a few steps;
the table gives rank 0's medians and the ratios.

Run: `clorch-bench ddp` (starts 2 gloo ranks with clorch's launcher) or
`torchrun --standalone --nproc-per-node 2 -m clorch.bench.ddp`.
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
import time

import torch

import clorch.distributed as cd
from clorch.bench.stats import format_table, interleave, median, ratio
from clorch.env import with_multicast_off
from clorch.nn.parallel import DistributedDataParallel

DEFAULTS = {"width": 2048, "features": 512, "batch": 64, "rounds": 15, "steps": 3,
            "warmup": 3, "bucket_cap_mb": 25.0, "threads": 1}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="clorch-bench ddp", description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=DEFAULTS["width"], help="hidden width of the MLP")
    p.add_argument("--features", type=int, default=DEFAULTS["features"], help="input/output width")
    p.add_argument("--batch", type=int, default=DEFAULTS["batch"], help="rows per rank per step")
    p.add_argument("--rounds", type=int, default=DEFAULTS["rounds"], help="interleaved rounds")
    p.add_argument("--steps", type=int, default=DEFAULTS["steps"], help="steps per timed sample")
    p.add_argument("--warmup", type=int, default=DEFAULTS["warmup"], help="untimed rounds first")
    p.add_argument("--bucket-cap-mb", type=float, default=DEFAULTS["bucket_cap_mb"],
                   help="bucket cap (MiB) for clorch's and torch's DDP")
    p.add_argument("--threads", type=int, default=DEFAULTS["threads"], help="torch threads per rank")
    p.add_argument("--nproc", type=int, default=2, help="ranks to start when not under a launcher")
    return p


def _mlp(args: dict) -> torch.nn.Module:
    torch.manual_seed(0)
    f, w = args["features"], args["width"]
    return torch.nn.Sequential(torch.nn.Linear(f, w), torch.nn.ReLU(), torch.nn.Linear(w, w // 2),
                               torch.nn.ReLU(), torch.nn.Linear(w // 2, w), torch.nn.ReLU(),
                               torch.nn.Linear(w, f))


def _candidate(forward, optimizer, step, batch, steps):
    """One sample: mean seconds per training step over `steps` steps, ranks aligned first."""
    x, y = batch

    def run() -> float:
        cd.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            torch.nn.functional.mse_loss(forward(x), y).backward()
            step(optimizer)
        return (time.perf_counter() - start) / steps

    return run


def _plain_step(optimizer):
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _candidates(args: dict, rank: int) -> tuple[dict, int]:
    base = _mlp(args)
    gen = torch.Generator().manual_seed(100 + rank)
    batch = (torch.randn(args["batch"], args["features"], generator=gen),
             torch.randn(args["batch"], args["features"], generator=gen))
    cap = args["bucket_cap_mb"]
    ours = DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=cap)
    ours_bf16 = DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=cap, reduce_dtype="bf16")
    theirs = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=cap)
    single = copy.deepcopy(base)
    sgd = lambda model: torch.optim.SGD(model.parameters(), lr=1e-4)  # noqa: E731
    steps = args["steps"]
    candidates = {
        "clorch DDP": _candidate(ours, sgd(ours), ours.optimizer_step, batch, steps),
        "clorch DDP bf16": _candidate(ours_bf16, sgd(ours_bf16), ours_bf16.optimizer_step, batch, steps),
        "torch DDP": _candidate(theirs, sgd(theirs), _plain_step, batch, steps),
        "one process": _candidate(single, sgd(single), _plain_step, batch, steps),
    }
    return candidates, sum(p.numel() for p in base.parameters())


def worker(ctx: dict) -> dict:
    """One rank's benchmark (every rank runs it); returns rank 0's table and medians."""
    args = {**DEFAULTS, **(ctx.get("args") or {})}
    torch.set_num_threads(args["threads"])
    candidates, params = _candidates(args, ctx["rank"])
    interleave(candidates, args["warmup"])
    samples = interleave(candidates, args["rounds"])
    medians = {name: median(values) for name, values in samples.items()}
    rows = [[name, medians[name] * 1e3, ratio(medians[name], medians["torch DDP"]),
             ratio(medians[name], medians["one process"])] for name in medians]
    title = (f"DDP step, MLP {params / 1e6:.1f}M params, batch {args['batch']}/rank, "
             f"{ctx['world_size']} ranks, {ctx['backend']}, bucket_cap_mb {args['bucket_cap_mb']}, "
             f"{args['rounds']} rounds x {args['steps']} steps (rank 0)")
    table = title + "\n" + format_table(["candidate", "median ms/step", "/ torch DDP", "/ one process"], rows)
    return {"table": table, "medians_s": medians, "params": params}


def _argv_args(ns: argparse.Namespace) -> dict:
    return {key: getattr(ns, key) for key in DEFAULTS}


def _under_launcher(ns: argparse.Namespace) -> int:
    with cd.process_group(backend="gloo"):
        ctx = {"rank": cd.rank(), "local_rank": cd.local_rank(), "world_size": cd.world_size(),
               "backend": cd.backend(), "process_group": None, "args": _argv_args(ns)}
        result = worker(ctx)
    if ctx["rank"] == 0:
        print(result["table"])
    return 0


def _launch(ns: argparse.Namespace, argv: list[str]) -> int:
    try:
        from clorch.launch import await_job, job_logs, job_status, launch
    except ImportError:  # launcher not installed: fall back to torchrun
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={ns.nproc}", "-m", "clorch.bench.ddp", *argv]
        return subprocess.call(cmd, env=with_multicast_off(os.environ))
    job = launch("clorch.bench.ddp:worker", nproc_per_node=ns.nproc, backend="gloo",
                 args=_argv_args(ns), timeout=1800)
    status = await_job(job)
    if status.get("state") != "succeeded":
        print(job_logs(job, 0).get("stderr", ""), file=sys.stderr)
        print(f"benchmark job ended {status.get('state')}: {status.get('error')}", file=sys.stderr)
        return 1
    print(job_status(job)["results"][0]["table"])
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ns = parser().parse_args(argv)
    if os.environ.get("RANK") is not None:
        return _under_launcher(ns)
    return _launch(ns, argv)


if __name__ == "__main__":
    sys.exit(main())
