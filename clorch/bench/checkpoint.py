"""`clorch-bench checkpoint`: save_checkpoint/load_checkpoint vs torch.save + fsync / torch.load.

The payload is a model and its AdamW state (about 1 GB at the default size:
params P fp32 = 4P bytes, plus exp_avg and exp_avg_sq = 8P bytes). Each round
runs, in rotating order:

* clorch save: `save_checkpoint` (XXH3-128 per block, fsync, atomic rename, dir fsync)
* torch save:  `torch.save(the same dict, file)` + flush + fsync
* clorch load: `load_checkpoint` (verify every byte, weights_only, restore model + optimizer)
* torch load:  `torch.load(weights_only=True)` + the same two `load_state_dict` calls

Files go to a temporary directory (removed at the end). Loads read from the
page cache in both cases (the files were just written).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

import torch

from clorch.bench.stats import format_table, human_bytes, interleave, median, ratio, timed
from clorch.checkpoint import load_checkpoint, save_checkpoint


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clorch-bench checkpoint", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--params-m", type=float, default=85.0, help="model parameters, millions (85 -> ~1 GB with AdamW state)"
    )
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds (default 4)")
    parser.add_argument("--dir", default=None, help="directory for the temporary files (default: system temp)")
    return parser


def _payload(params_m: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A stack of square Linear layers with ~params_m million parameters and one AdamW step taken."""
    width = 2048
    layers = max(1, round(params_m * 1e6 / (width * width + width)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()
    return model, optimizer


def _torch_save(path: Path, model, optimizer) -> None:
    with open(path, "wb") as handle:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, handle)
        handle.flush()
        os.fsync(handle.fileno())


def _torch_load(path: Path, model, optimizer) -> None:
    loaded = torch.load(path, weights_only=True)
    model.load_state_dict(loaded["model"])
    optimizer.load_state_dict(loaded["optimizer"])


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    model, optimizer = _payload(args.params_m)
    params = sum(p.numel() for p in model.parameters())
    workdir = Path(tempfile.mkdtemp(prefix="clorch-bench-ckpt-", dir=args.dir))
    try:
        ours, theirs = workdir / "clorch.ckpt", workdir / "torch.pt"
        samples = interleave(
            {
                "save": lambda: timed(lambda: save_checkpoint(ours, model=model, optimizer=optimizer)),
                "torch_save": lambda: timed(lambda: _torch_save(theirs, model, optimizer)),
                "load": lambda: timed(lambda: load_checkpoint(ours, model=model, optimizer=optimizer)),
                "torch_load": lambda: timed(lambda: _torch_load(theirs, model, optimizer)),
            },
            args.rounds,
        )
        archive_bytes = sum(p.stat().st_size for p in workdir.glob("clorch.ckpt*"))
        torch_bytes = theirs.stat().st_size
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    rows = []
    for op in ("save", "load"):
        mine, peer = median(samples[op]), median(samples[f"torch_{op}"])
        rows.append(
            [
                op,
                mine,
                peer,
                ratio(mine, peer),
                " ".join(f"{s:.2f}" for s in samples[op]),
                " ".join(f"{s:.2f}" for s in samples[f"torch_{op}"]),
            ]
        )
    print(
        f"model + AdamW: {params / 1e6:.1f}M fp32 params, clorch files {human_bytes(archive_bytes)}, "
        f"torch file {human_bytes(torch_bytes)}, {args.rounds} interleaved rounds, "
        f"{os.cpu_count()} CPUs"
    )
    print(format_table(["op", "clorch median s", "torch median s", "ratio", "clorch samples", "torch samples"], rows))
    return 0
