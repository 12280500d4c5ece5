"""World size 1 on one GPU: does a high-priority copy stream hide the bucket copies?

`overlap_grad_copies=True` copies each full bucket on a side stream of normal priority, where
its kernels queue behind the backward's. This runs, interleaved round by round, the bare
model, the bucket path, the bucket path with overlapped copies on a normal-priority stream
and on the highest-priority stream CUDA offers, and torch's DDP (GPT-2 small, bf16, fused
AdamW, 8 x 1024 tokens), with clorch-bench ddp's candidates and timing.

    PYTHONPATH=. python records/gpu/2026-12-01-h200/scripts/priority.py [ROUNDS]
"""

import sys

import torch

import clorch.distributed as cd
import clorch.nn.parallel.streams as streams
from clorch.bench import ddp
from clorch.bench.stats import format_table, interleave, median, ratio

KEEP = ("one process", "clorch DDP bucket path", "clorch DDP bucket path overlapped copies",
        "torch DDP", "torch DDP best", ddp.EMPTY_HOOKS)
HIGH = "clorch DDP bucket path overlapped copies, high-priority stream"


def _high_priority_init(original):
    def init(self, device, overlap_grad_copies):
        original(self, device, overlap_grad_copies)
        if self.copy_stream is not None:
            _, highest = torch.cuda.Stream.priority_range()
            self.copy_stream = torch.cuda.Stream(device, priority=highest)
    return init


def worker(ctx):
    rounds = ctx["args"]["rounds"]
    args = {**ddp.DEFAULTS, "model": "gpt2-small", "device": "cuda", "batch": 8}
    candidates, work = ddp._candidates(args, ctx["rank"])
    candidates = {name: run for name, run in candidates.items() if name in KEEP}
    original = streams.BackwardStreams.__init__
    streams.BackwardStreams.__init__ = _high_priority_init(original)
    try:
        extra, _ = ddp._candidates(args, ctx["rank"])
    finally:
        streams.BackwardStreams.__init__ = original
    candidates[HIGH] = extra["clorch DDP bucket path overlapped copies"]
    interleave(candidates, 3)
    samples = interleave(candidates, rounds)
    medians = {name: median(values) for name, values in samples.items()}
    rows = [[name, medians[name] * 1e3, ratio(medians[name], medians["one process"])] for name in medians]
    return (f"priority range {torch.cuda.Stream.priority_range()}, {rounds} rounds x {args['steps']} steps\n"
            + format_table(["candidate", "median ms/step", "/ one process"], rows))


if __name__ == "__main__":
    job = cd.launch("priority:worker", nproc_per_node=1, backend="nccl", devices=[0],
                    args={"rounds": int(sys.argv[1]) if len(sys.argv) > 1 else 25}, timeout=900)
    status = job.wait()
    if status["state"] != "succeeded":
        print(cd.job_logs(job, 0)["stderr"], file=sys.stderr)
        sys.exit(1)
    print(status["results"][0])
