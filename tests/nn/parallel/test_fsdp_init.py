"""How `clorch-train parallel=fsdp` gets its first weights, against the same config under `parallel=ddp`.

One launch of 2 real gloo ranks builds the engine's components (`build_components`)
for each case below under both `parallel` options and gathers each model's full
state; the test compares them here:

- the seeded start of the built-in GPT: fsdp (built on the meta device, sharded,
  drawn module by module) equals ddp exactly, on both ranks;
- `model.init_from` from a safetensors file: fsdp equals ddp, and both equal the file;
  from a torch.save'd state dict (keys with torch.compile's `_orig_mod.` prefix) and a
  clorch checkpoint, fsdp equals the file; with `init_strict=false` and half the blocks'
  tensors, the rest keeps the seeded start (ddp's rule); a file of the wrong shape raises
  the ValueError `load_weights` raises for the whole model (ddp's path);
- the bytes torch's CPU allocator holds (its profiler's net allocations, peak)
  while the fsdp components are built from each file: at most one rank's shard of
  the model plus its largest tensor (with 16 KiB for the rest of the build), and
  less than the whole model;
- a model of your own (`model._target_`, below) that initializes itself in
  `__init__` and computes a non-persistent buffer: without init_from (built whole
  on the host, then sharded) and with an init_from that holds all of it (built
  with its parameters on the meta device) fsdp equals ddp, buffer included;
- of all the fsdp builds, only that model without init_from is built whole in host
  memory (the engine's function for it, wrapped in the ranks, counts its calls).

Exact equality everywhere: both paths draw or read the same numbers and only copy them.
"""

from __future__ import annotations

import gc
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn
from torch.distributed.tensor import DTensor
from torch.profiler import ProfilerActivity, profile

from clorch.checkpoint import save_checkpoint
from clorch.checkpoint.weights import load_weights
from clorch.config import compose
from clorch.builders import rank_model as model_build
from clorch.train.components import build_components
from clorch.builders.data import model_sizes_of
from clorch.builders.model import build_model_for
from clorch.plan.plan import resolve
from tests.harness import run_ranks

pytestmark = pytest.mark.timeout(180)

GPT_JOB = [
    "backend=gloo",
    "precision=fp32",
    "model=gpt",
    "data=arithmetic",
    "data.sample_count=64",
    "model.n_layer=4",
    "model.d_model=128",
    "model.n_head=2",
    "launcher.nproc_per_node=2",
    "seed=11",
]
OWN_JOB = [
    "backend=gloo",
    "precision=fp32",
    "model._target_=tests.nn.parallel.test_fsdp_init.ScaledNet",
    "data=synthetic",
    "data.sample_count=64",
    "launcher.nproc_per_node=2",
    "seed=11",
]
SLACK_BYTES = 16 * 1024


class ScaledNet(nn.Module):
    """A model of your own: its `__init__` draws its weights (std 0.5, not torch's default)
    and computes a buffer that no weights file holds (non-persistent)."""

    def __init__(self, in_features: int = 8, out_features: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(in_features, 64)
        self.out = nn.Linear(64, out_features)
        for p in self.parameters():
            nn.init.normal_(p, std=0.5)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 64), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.inp(x)) * self.scale)


def _config(overrides: list[str]):
    return resolve(compose(overrides)).config


def _full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer, gathered whole (collective for a sharded model)."""
    tensors = {**model.state_dict(), **{f"buffer:{k}": v for k, v in model.named_buffers()}}
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone() for k, v in tensors.items()}


def _local_bytes(model: nn.Module) -> int:
    return sum((p.to_local() if isinstance(p, DTensor) else p).untyped_storage().nbytes() for p in model.parameters())


def _peak_allocated(prof, mapped: int) -> int:
    """The peak of the CPU allocator's net allocations over the profiled window, without the
    weights file's own mapping (`mapped` bytes: a storage over the file, whose pages the kernel
    reads on use and may drop again; the profiler reports it as one allocation)."""
    running = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        if abs(event.self_cpu_memory_usage) != mapped:
            running += event.self_cpu_memory_usage
            peak = max(peak, running)
    return peak


def _with(cfg, **model_keys):
    """The config with other `model.*` values (init_from, init_strict), composed once in the test."""
    return replace(cfg, model=replace(cfg.model, **model_keys))


def _build(rank: int, world: int, cfg, mapped: int | None = None) -> dict:
    gc.collect()
    if mapped is None:
        parts = build_components(cfg, {"rank": rank, "world_size": world}, 1)
        return {"state": _full_state(parts.raw_model)}
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        parts = build_components(cfg, {"rank": rank, "world_size": world}, 1)
    model = parts.raw_model
    return {"state": _full_state(model), "peak": _peak_allocated(prof, mapped), "local": _local_bytes(model)}


def _error(rank: int, world: int, cfg) -> str:
    try:
        build_components(cfg, {"rank": rank, "world_size": world}, 1)
    except ValueError as exc:
        return str(exc)
    return "no error"


def _checks(rank: int, world: int, configs: dict, files: dict[str, str], mapped: dict[str, int]) -> dict:
    out: dict = {"host_builds": []}
    # Which fsdp builds made the whole model in host memory (fsdp's one exception): recorded by
    # wrapping the builder's `whole`, which a strategy calls for a whole model (ddp's always does).
    whole = model_build.ModelBuilder.whole

    def recorded(builder):
        if builder.cfg.parallel.name == "fsdp":
            out["host_builds"].append((type(builder.cfg.model).__name__, builder.cfg.model.init_from))
        return whole(builder)

    model_build.ModelBuilder.whole = recorded
    for parallel in ("ddp", "fsdp"):
        gpt, own = configs[f"gpt/{parallel}"], configs[f"own/{parallel}"]
        out[f"seeded/{parallel}"] = _build(rank, world, gpt)
        out[f"own/{parallel}"] = _build(rank, world, own)
        out[f"own_file/{parallel}"] = _build(rank, world, _with(own, init_from=files["own"]))
    out["safetensors/ddp"] = _build(rank, world, _with(configs["gpt/ddp"], init_from=files["safetensors"]))
    # fsdp from each file, measuring the bytes; against the file itself (and ddp's load of it).
    gpt = configs["gpt/fsdp"]
    for kind in ("safetensors", "pt", "checkpoint"):
        out[f"measured/{kind}"] = _build(rank, world, _with(gpt, init_from=files[kind]), mapped[kind])
    out["partial"] = _build(rank, world, _with(gpt, init_from=files["partial"], init_strict=False))
    out["wrong"] = _error(rank, world, _with(gpt, init_from=files["wrong"]))
    model_build.ModelBuilder.whole = whole
    return out


def _random_model(cfg, seed: int) -> nn.Module:
    """The config's model with values that are none of the seeded start's (tied weights stay tied)."""
    model = build_model_for(cfg, model_sizes_of(cfg))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator))
    return model


def _files(tmp, configs: dict) -> tuple[dict[str, str], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    model = _random_model(configs["gpt/ddp"], 1)
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    files = {kind: str(tmp / name) for kind, name in (("safetensors", "w.safetensors"), ("pt", "w.pt"))}
    save_file(weights, files["safetensors"])  # tied weights under both names, each its own copy
    torch.save({f"_orig_mod.{k}": v for k, v in weights.items()}, files["pt"])
    files["checkpoint"] = str(tmp / "ckpt" / "step.json")
    save_checkpoint(files["checkpoint"], model=model)
    # Every other tensor of the blocks: the embeddings (tied to the output) keep their seeded start.
    partial = dict([(k, v) for k, v in weights.items() if k.startswith("blocks.")][::2])
    files["partial"] = str(tmp / "partial.safetensors")
    save_file({k: v.clone() for k, v in partial.items()}, files["partial"])
    wrong = {k: v.clone() for k, v in weights.items()}
    first = next(iter(wrong))
    wrong[first] = torch.zeros(3, 3)
    files["wrong"] = str(tmp / "wrong.safetensors")
    save_file(wrong, files["wrong"])
    own = {k: v.detach().clone() for k, v in _random_model(configs["own/ddp"], 2).state_dict().items()}
    files["own"] = str(tmp / "own.safetensors")
    save_file(own, files["own"])
    return files, weights, partial


def _equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert torch.equal(got[name], value), name


def test_fsdp_starts_where_ddp_does_seeded_and_from_each_kind_of_file_holding_one_shard(tmp_path, monkeypatch):
    monkeypatch.setenv("CLORCH_TRUSTED_MODULES", "tests")
    configs = {
        f"{name}/{parallel}": _config([*job, f"parallel={parallel}"])
        for name, job in (("gpt", GPT_JOB), ("own", OWN_JOB))
        for parallel in ("ddp", "fsdp")
    }
    files, weights, partial = _files(tmp_path, configs)
    mapped = {kind: os.path.getsize(files[kind]) for kind in ("safetensors", "pt")}
    archive = [p for p in Path(files["checkpoint"]).parent.iterdir() if p.suffix != ".json"]
    mapped["checkpoint"] = archive[0].stat().st_size
    first, second = run_ranks(_checks, 2, configs, files, mapped, timeout=150)
    for rank in (first, second):  # every rank's gathered state is the same whole model
        for case in ("seeded", "own", "own_file"):
            _equal(rank[f"{case}/fsdp"]["state"], first[f"{case}/ddp"]["state"])
        _equal(rank["measured/safetensors"]["state"], first["safetensors/ddp"]["state"])
        for kind in ("safetensors", "pt", "checkpoint"):
            _equal({k: v for k, v in rank[f"measured/{kind}"]["state"].items() if k in weights}, weights)
    seeded = first["seeded/ddp"]["state"]
    _equal({k: v for k, v in first["safetensors/ddp"]["state"].items() if k in weights}, weights)
    for rank in (first, second):  # loaded where the file has the key, else the seeded start (as ddp)
        loaded = rank["partial"]["state"]
        for name in weights:
            assert torch.equal(loaded[name], partial[name] if name in partial else seeded[name]), name
    assert not torch.equal(partial[next(iter(partial))], seeded[next(iter(partial))])
    # The same error as a whole model's load (ddp's path: load_weights on the model in one process).
    whole_model = _random_model(configs["gpt/ddp"], 3)
    with pytest.raises(ValueError) as ddp_error:
        load_weights(whole_model, files["wrong"])
    assert first["wrong"] == second["wrong"] == str(ddp_error.value) and "another shape" in first["wrong"]
    # Only a model of your own without init_from was built whole (every rank alike).
    assert first["host_builds"] == second["host_builds"] == [("TargetModelConfig", None)]
    # A model of your own: its own init kept (std 0.5), its computed buffer kept under fsdp.
    assert first["own/ddp"]["state"]["inp.weight"].std().item() > 0.3
    assert torch.equal(first["own_file/fsdp"]["state"]["buffer:scale"], torch.linspace(0.5, 1.5, 64))
    # One rank's bytes while it reads each file: its shard and one tensor, never the whole model.
    whole = sum(v.numel() * 4 for k, v in seeded.items() if k != "lm_head.weight")  # tied to tok_emb
    largest = max(v.numel() * 4 for v in seeded.values())
    for rank in (first, second):
        for kind in ("safetensors", "pt", "checkpoint"):
            run = rank[f"measured/{kind}"]
            assert run["local"] < whole * 0.55, (kind, run["local"], whole)
            assert run["peak"] <= run["local"] + largest + SLACK_BYTES, (kind, run["peak"], run["local"], largest)
            assert run["peak"] < whole, (kind, run["peak"], whole)
