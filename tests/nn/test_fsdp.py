"""fully_shard through clorch: the same training as clorch's DDP and as one process, at 1/world the bytes.

Each multi-rank check is one launch of real gloo ranks (tests/harness.py) running
several trainings one after another; the one-process reference runs here.

Tolerances (fp32): losses agree to rtol 1e-5 and weights after 4 AdamW steps to
atol 1e-4. The gradients are the same sums in another order (a reduce-scatter or
an all-reduce of per-rank means against one batch's mean), so they differ in
the last bits; AdamW divides each gradient by its running RMS, which turns a
last-bit difference of a near-zero gradient into up to ~1e-5 of a step of lr
3e-3 (measured: 2e-5 at most). bf16 (parameters gathered and computed in bf16,
gradients reduced in fp32) is compared with the fp32 run at loss rtol 2e-2.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from clorch.models.gpt import GPT
from clorch.nn.parallel.fsdp import (
    apply_activation_checkpointing,
    clip_grad_norm_,
    materialize,
    mixed_precision_policy,
    shard_model,
    sharded_modules,
)
from tests.harness import run_ranks
from tests.nn.fsdp_training import CONFIG, Run, full_weights, single, train_each

pytestmark = pytest.mark.timeout(240)

LOSS_RTOL, WEIGHT_ATOL, BF16_LOSS_RTOL = 1e-5, 1e-4, 2e-2


def _close_weights(got: dict, want: dict, atol: float) -> float:
    assert got.keys() == want.keys()
    worst = max((got[k] - want[k]).abs().max().item() for k in want)
    assert worst <= atol, f"weights differ by {worst} > {atol}"
    return worst


def _full_bytes(reference: dict) -> tuple[int, int]:
    return reference["param_bytes"], reference["state_bytes"]


def test_fsdp_matches_ddp_and_one_process_on_two_ranks_with_half_the_bytes():
    reference = single(Run(batch_size=8))  # the same global batch of 8 in one process
    runs = [
        Run(mode="fsdp"),
        Run(mode="ddp"),
        Run(mode="fsdp", checkpointing=True),
        Run(mode="ddp", checkpointing=True),
        Run(mode="fsdp", cpu_offload=True),
        Run(mode="fsdp", reshard_after_forward=False),
        Run(mode="fsdp", precision="bf16"),
    ]
    results = run_ranks(train_each, 2, runs, timeout=200)
    params, state = _full_bytes(reference)
    for rank_results in results:
        for run, got in zip(runs, rank_results):
            if run.precision == "bf16":
                assert got["losses"] == pytest.approx(reference["losses"], rel=BF16_LOSS_RTOL)
                continue
            assert _close_weights(got["initial"], reference["initial"], 0.0) == 0.0  # seeded start
            assert got["losses"] == pytest.approx(reference["losses"], rel=LOSS_RTOL), run
            _close_weights(got["weights"], reference["weights"], WEIGHT_ATOL)
            if run.mode == "fsdp":
                # Every parameter is split in two along dim 0 (all sizes here are even).
                assert (got["param_bytes"], got["state_bytes"]) == (params // 2, state // 2)
            else:
                assert (got["param_bytes"], got["state_bytes"]) == (params, state)
    # Both ranks see the same full weights.
    for a, b in zip(results[0], results[1]):
        _close_weights(a["weights"], b["weights"], 0.0)


def test_fsdp_on_four_ranks_matches_one_process_with_a_quarter_of_the_bytes():
    reference = single(Run(batch_size=8))
    own_reference = _own_model_training(0, 1)
    results = run_ranks(_four_ranks, 4, timeout=200)
    params, state = _full_bytes(reference)
    for got, own in results:
        # Your own model, its blocks named by class; Linear(8, 2)'s 2 rows leave 2 ranks empty.
        for name, value in own_reference.items():
            assert torch.allclose(own[name], value, rtol=0, atol=1e-6), name
        assert got["losses"] == pytest.approx(reference["losses"], rel=LOSS_RTOL)
        _close_weights(got["weights"], reference["weights"], WEIGHT_ATOL)
        # Dim 0 of every parameter here is a multiple of 4: no padding, exactly a quarter.
        assert (got["param_bytes"], got["state_bytes"]) == (params // 4, state // 4)


def _own_model() -> nn.Module:
    with torch.device("meta"):
        return nn.Sequential(_OwnBlock(), _OwnBlock(), nn.Linear(8, 2))


def _own_model_training(rank: int, world_size: int) -> dict[str, torch.Tensor]:
    """3 SGD steps of a model of your own; a world of 1 is the unsharded reference, run here."""
    model = _own_model()
    if world_size > 1:
        shard_model(model, shard_modules=["_OwnBlock"])
    materialize(model, "cpu", seed=11)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 8, generator=generator), torch.randn(16, 2, generator=generator)
    share = 16 // world_size
    for _ in range(3):
        mine = slice(rank * share, (rank + 1) * share)
        torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
        clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        optimizer.zero_grad()
    return full_weights(model)


def _four_ranks(rank: int, world_size: int) -> tuple[dict, dict]:
    [gpt] = train_each(rank, world_size, [Run(mode="fsdp", batch_size=2)])
    return gpt, _own_model_training(rank, world_size)


class _OwnBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        return self.norm(x + self.inner(x))


def test_choosing_modules_by_class_name_and_auto_threshold():
    with torch.device("meta"):
        model = nn.Sequential(_OwnBlock(), _OwnBlock(), nn.Linear(8, 2))
        gpt = GPT(CONFIG)
    assert sharded_modules(model, ["_OwnBlock"]) == [model[0], model[1]]
    assert sharded_modules(model, "auto", min_params=80) == [model[0], model[1]]  # 72 + 16 params each
    assert sharded_modules(model, "auto", min_params=10) == [model[0], model[1], model[2]]
    assert sharded_modules(gpt, "auto") == list(gpt.blocks)
    with pytest.raises(ValueError, match=r"not in the model: \['Block'\].*_OwnBlock"):
        sharded_modules(model, ["Block"])
    with pytest.raises(TypeError, match="shard_modules"):
        sharded_modules(model, "Block")
    with pytest.raises(ValueError, match="min_params"):
        sharded_modules(model, "auto", min_params=0)
    with pytest.raises(ValueError, match="name your model's block classes"):
        apply_activation_checkpointing(model)
    assert apply_activation_checkpointing(model, ["_OwnBlock"]) == 2


def test_materialize_depends_on_the_seed_only_and_keeps_ties():
    def built(seed):
        with torch.device("meta"):
            model = GPT(CONFIG)
        return materialize(model, "cpu", seed=seed, init_fn=model._init_weights)

    torch.manual_seed(1)
    a = built(3)
    torch.manual_seed(2)  # the global generator plays no part ...
    state = torch.get_rng_state()
    b = built(3)
    assert torch.equal(torch.get_rng_state(), state)  # ... and is left as it was
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert a.lm_head.weight is a.tok_emb.weight
    assert not torch.equal(a.blocks[0].mlp.fc.weight, built(4).blocks[0].mlp.fc.weight)
    # GPT-2's initialization, not Linear's default: std 0.02, residual projections smaller.
    assert abs(a.blocks[0].mlp.fc.weight.std().item() - 0.02) < 0.004
    assert a.blocks[0].mlp.proj.weight.std().item() < 0.015


def test_materialize_refuses_parameters_it_cannot_initialize():
    class Bare(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.empty(3))
            self.register_buffer("table", torch.empty(3))

    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(3, 3), Bare())
    with pytest.raises(ValueError, match=r"parameters of \['1 \(Bare\)'\].*pass init_fn="):
        materialize(model, "cpu")
    with pytest.warns(UserWarning, match=r"buffers of \['1 \(Bare\)'\]"):
        materialize(model, "cpu", init_fn=lambda m: nn.init.ones_(m.scale) if isinstance(m, Bare) else None)
    assert torch.equal(model[1].scale, torch.ones(3))


def test_mixed_precision_policy_follows_clorch_precision_names():
    assert mixed_precision_policy("fp32") is None
    policy = mixed_precision_policy("bf16")
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    policy = mixed_precision_policy("fp32", reduce_dtype="bf16")
    assert (policy.param_dtype, policy.reduce_dtype) == (None, torch.bfloat16)
    with pytest.raises(ValueError, match="precision must be one of"):
        mixed_precision_policy("bf17")
