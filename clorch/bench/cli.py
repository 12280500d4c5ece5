"""`clorch-bench`: one subcommand per benchmark, each in its own module.

Every benchmark runs clorch and its peer interleaved in the same process run
(A B A B ...), reports medians and the clorch/peer ratio, and prints a table.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = {
    "allreduce": ("clorch.bench.allreduce", "clorch.distributed.all_reduce vs raw torch.distributed.all_reduce"),
    "launch": ("clorch.bench.launch", "clorch's launcher vs torchrun: time to the first all_reduce"),
    "ddp": ("clorch.bench.ddp", "clorch's DDP reducer vs torch DDP vs one process"),
    "fsdp": ("clorch.bench.fsdp", "clorch's fsdp sharding vs a hand-written fully_shard loop (GPT step)"),
    "scaler": ("clorch.bench.scaler", "clorch.amp.GradScaler vs torch.amp.GradScaler: unscale + overflow check"),
    "checkpoint": ("clorch.bench.checkpoint", "save_checkpoint/load_checkpoint vs torch.save/torch.load"),
    "sweep": ("clorch.bench.sweep", "a sweep's trials side by side and pruned vs one at a time; a trial's fixed cost"),
    "runner": ("clorch.bench.runner", "clorch's training loop vs a plain PyTorch loop (GPT-2 small, GPU)"),
    "exact": ("clorch.bench.exact", "exact=true vs the default on the same run: the cost of bitwise reproducibility"),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="clorch-bench",
        description="Benchmarks comparing clorch with its peers, interleaved in one run.",
        epilog="\n".join(f"  {name:<11} {text}" for name, (_, text) in SUBCOMMANDS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "subcommand", choices=sorted(SUBCOMMANDS), metavar="SUBCOMMAND", help="one of: " + ", ".join(SUBCOMMANDS)
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        _parser().print_help()
        return 0
    args = _parser().parse_args(argv[:1])
    module = importlib.import_module(SUBCOMMANDS[args.subcommand][0])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
