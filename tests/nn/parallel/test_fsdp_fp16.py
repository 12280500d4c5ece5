"""precision=fp16 under parallel=fsdp against the same job under parallel=ddp, on 2 CPU ranks over gloo.

One launch: each rank builds the engine's components (`build_components`) for a small
GPT in fp16 under ddp and under fsdp, and runs the engine's `train_step` on the same
batches, with gradient accumulation 2 and clipping (the sharded gradients are unscaled
before their norm is taken). The first loss scale (2**32) overflows fp16's gradients,
so step 1 is skipped; the backoff (2**-20) brings the scale to 2**12, where the
following steps run.

The skipped step: the same steps are skipped under both, on both ranks, the scale
after every step is the same, and fsdp's weights after the skipped step are
exactly its initial ones (which are ddp's: tests/nn/parallel/test_fsdp_init.py).

Tolerance: each step's loss within 2e-4 relative of ddp's (measured on 2026-12-04: 1.4e-5
at most over the 5 steps of both ranks). The two compute in fp16 with the same
fp16-rounded matmul weights, but fsdp also holds the LayerNorm weights and the
embeddings in fp16 (FSDP's mixed-precision policy casts every parameter) where ddp's
autocast keeps them fp32, and sums the gradients in another order (a reduce-scatter of
shards against an all-reduce of buckets): activations and gradients differ in their
last fp16 bits, and AdamW carries that into the next steps' losses.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.distributed.tensor import DTensor

from clorch.config import compose
from clorch.train.components import build_components
from clorch.train.loop import train_step
from tests.pins import check_pinned
from clorch.strategies import weights_digest
from clorch.plan.plan import resolve
from tests.harness import run_ranks

pytestmark = pytest.mark.timeout(150)

JOB = [
    "backend=gloo",
    "model=gpt",
    "data=arithmetic",
    "data.sample_count=96",
    "model.n_layer=2",
    "model.d_model=32",
    "model.n_head=2",
    "batch_size=4",
    "accumulation=2",
    "optim.grad_clip=0.5",
    "launcher.nproc_per_node=2",
    "seed=5",
]
FP16 = [
    "precision=fp16",
    "precision.scaler.initial_scale=4294967296",  # 2**32
    "precision.scaler.backoff_factor=9.5367431640625e-07",  # 2**-20
]
STEPS, LOSS_RTOL = 5, 2e-4
# weights_digest after STEPS steps, printed by this test at commit a880d15 (before clorch.strategies),
# per kind of CPU (tests/pins.py); the second pin was taken at 74d5c33 (see test_parallel_fsdp.py)
PINNED_FP16 = {
    "2026-12-06 machine": {
        "ddp": "78a6529e2511584d043cb0b440222b41d75a642ce58587d22848676128447ca0",
        "fsdp": "5d91ff23523d685240ce41677524661f8965fd9c83abfe412ae4c2f9bc7d1b1c",
    },
    "AVX512 Intel(R) Xeon(R) Processor": {
        "ddp": "737e13958ba7949070d7918253f43c5598dd74cb98ab3fd0b4d0cfdb8e460235",
        "fsdp": "bf7ec3970072171a1e011ea1da6be0656625f519e9c3aeed90603ba404cb0bc9",
    },
}


def _full(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone() for k, v in model.state_dict().items()
    }


def _train(rank: int, world: int, cfg) -> dict:
    parts = build_components(cfg, {"rank": rank, "world_size": world}, STEPS)
    indices = parts.sampler.sample_indices()
    per_step = parts.batch_size * parts.accumulation
    initial = _full(parts.raw_model)
    losses, stepped, scales, after_first = [], [], [], None
    for step in range(STEPS):
        chunk = indices[step * per_step : (step + 1) * per_step]
        micro = [parts.task.batch(chunk[i : i + parts.batch_size]) for i in range(0, per_step, parts.batch_size)]
        result = train_step(parts, micro)
        losses.append(result.loss.item())
        stepped.append(bool(result.stepped))
        scales.append(parts.precision.scale)
        if step == 0:
            after_first = _full(parts.raw_model)
    return {
        "losses": losses,
        "stepped": stepped,
        "scales": scales,
        "initial": initial,
        "after_first": after_first,
        "params": [type(p).__name__ for p in parts.raw_model.parameters()][:1],
        "digest": weights_digest(parts.raw_model),  # collective under fsdp: every rank gathers
    }


def _both(rank: int, world: int, configs: dict) -> dict:
    return {name: _train(rank, world, cfg) for name, cfg in configs.items()}


def test_fp16_under_fsdp_trains_and_skips_as_under_ddp():
    ddp = resolve(compose([*JOB, *FP16])).config
    # The fsdp job is the ddp one with the parallel group of an fsdp composition: the same
    # config in every other key.
    fsdp = replace(ddp, parallel=resolve(compose([*JOB, "parallel=fsdp"])).config.parallel)
    ranks = run_ranks(_both, 2, {"ddp": ddp, "fsdp": fsdp}, timeout=120)
    reference = ranks[0]["ddp"]
    assert reference["stepped"] == [False] + [True] * (STEPS - 1)  # the overflow happened, once
    assert reference["scales"][0] == 2.0**12
    for rank in ranks:
        run = rank["fsdp"]
        assert run["params"] == ["DTensor"]  # sharded, in fp16
        assert run["stepped"] == reference["stepped"] and run["scales"] == reference["scales"]
        for name, value in run["initial"].items():  # the skipped step left every weight as it was
            assert torch.equal(run["after_first"][name], value), name
        assert run["losses"] == pytest.approx(rank["ddp"]["losses"], rel=LOSS_RTOL)
    assert reference["losses"][-1] < reference["losses"][0]  # it learns, not just runs
    # The weights after the 5 steps, bit for bit: the digests this test printed on the tree before
    # the parallel modes became strategy classes (clorch.strategies; commit a880d15). A change that
    # moves how the scaler unscales, clips or steps must leave them as they are.
    check_pinned({name: ranks[0][name]["digest"] for name in ("ddp", "fsdp")}, PINNED_FP16, "74d5c33")
    assert ranks[1]["fsdp"]["digest"] == ranks[0]["fsdp"]["digest"]
