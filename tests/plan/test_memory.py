"""The plan's per-rank memory estimate: its figures by hand, the refusals it leads to, and the
per-rank bytes that sharding really leaves (measured on 2 gloo ranks)."""

from __future__ import annotations

import pytest
import torch

import clorch.plan.checks as checks
from clorch.config import compose
from clorch.config.checks import checked_partial
from clorch.builders.data import model_sizes_of
from clorch.plan.memory import (
    bytes_per_parameter,
    config_memory,
    CUDA_CONTEXT_BYTES,
    PROCESS_BYTES,
    gathered_bytes,
    gpt_activation_bytes,
    human_bytes,
    mlp_activation_bytes,
    rank_memory,
)
from clorch.builders.model import build_model_for
from clorch.plan.plan import plan_or_errors
from tests.harness import run_ranks

pytestmark = pytest.mark.timeout(120)

GIB = 2**30


def test_bytes_per_parameter_follow_the_optimizer_the_precision_and_the_ddp_buckets():
    assert bytes_per_parameter("adamw") == 4 + 4 + 8  # fp32 weights, gradients, two moments
    assert bytes_per_parameter("sgd", momentum=0.9) == 4 + 4 + 4
    assert bytes_per_parameter("sgd") == 4 + 4
    assert bytes_per_parameter("adamw", precision="bf16") == 16 + 2  # ddp: autocast's bf16 weights
    assert bytes_per_parameter("adamw", precision="bf16", sharded=True) == 16  # fsdp: fp32 shards
    assert bytes_per_parameter("adamw", ddp_reduce_dtype="bf16") == 16 + 2  # the buckets' bf16 copy
    assert bytes_per_parameter("adamw", precision="fp16", ddp_reduce_dtype="fp16") == 16 + 2 + 2
    assert bytes_per_parameter("adamw", ddp_reduce_dtype="float32") == 16  # no copy: the gradients' dtype
    assert bytes_per_parameter("adamw", sharded=True, ddp_reduce_dtype="bf16") == 16  # a ddp key only
    with pytest.raises(ValueError, match="optimizer must be one of"):
        bytes_per_parameter("lion")


def test_state_divides_by_the_shards_and_moves_to_the_host_when_offloaded():
    C, R = CUDA_CONTEXT_BYTES, PROCESS_BYTES  # on the GPU, on the host
    ddp = rank_memory(1000, 16, activations=50)
    assert (ddp.state, ddp.device, ddp.host) == (16000, 16050 + C, 4000 + R)  # host: the fp32 start, 4P
    fsdp = rank_memory(1000, 16, shards=4, gathered=100, activations=50)
    assert (fsdp.state, fsdp.device, fsdp.host) == (4000, 4150 + C, 4000 + R)
    offloaded = rank_memory(1000, 16, shards=2, gathered=100, activations=50, cpu_offload=True)
    assert (offloaded.device, offloaded.host) == (150 + C, 8000 + R)
    cpu = rank_memory(1000, 16, shards=2, gathered=100, activations=50, cpu_ranks=True)
    assert cpu.host == 8000 + 100 + 50 + R  # CPU ranks: everything is host memory
    assert rank_memory(1001, 16, shards=3).state == 5339  # 16016 / 3, rounded up (fully_shard pads)
    with pytest.raises(ValueError, match="shards must be >= 1"):
        rank_memory(10, 16, shards=0)


def test_gpt_activations_by_hand():
    # b=2, s=8: 16 tokens; L=2, d=16, f=64, V=32. A block keeps 8d + 2f = 256 elements a token.
    sizes = dict(n_layer=2, d_model=16, mlp_ratio=4, vocab_size=32)
    # bf16: 2 x (2 x 256 + 2 x 16 + 32) + 4 x 32 = 1280 bytes a token
    assert gpt_activation_bytes(2, 8, precision="bf16", **sizes) == 16 * 1280
    # checkpointing: L x d + one block = 32 + 256 in place of 512: 2 x (288 + 64) + 128 = 832
    assert gpt_activation_bytes(2, 8, precision="bf16", checkpointing=True, **sizes) == 16 * 832
    # fp32 with dropout: 4 x 576 + 128 + masks (2L + 1) x d = 80
    assert gpt_activation_bytes(2, 8, precision="fp32", dropout=0.1, **sizes) == 16 * (2304 + 128 + 80)
    # MLP: batch 4 x 2 bytes x (in 8 + 2 x hidden 32 x 1 + out 2)
    assert mlp_activation_bytes(4, in_features=8, hidden_features=32, out_features=2, depth=2, precision="bf16") == (
        4 * 2 * 74
    )


def test_gathered_units_by_hand():
    # bf16 (2 bytes): the root's 300 parameters stay gathered, plus two units of 1000
    assert gathered_bytes(5300, 300, 1000, "bf16", reshard_after_forward=True) == 2 * (300 + 2000)
    # without resharding after forward every parameter stays gathered through the step
    assert gathered_bytes(5300, 300, 1000, "fp32", reshard_after_forward=False) == 4 * (5300 + 2000)


def _config(overrides):
    cfg, errors = checked_partial(compose(overrides))
    assert not errors, errors
    sizes = model_sizes_of(cfg)
    with torch.device("meta"):
        return cfg, build_model_for(cfg, sizes)


GPT = ["model=gpt", "data=arithmetic", "model.n_layer=2", "model.d_model=64", "model.n_head=2", "batch_size=4"]


def test_a_gpt_config_by_hand():
    cfg, model = _config(GPT + ["parallel=fsdp", "precision=bf16", "model.activation_checkpointing=true"])
    arch, d = model.config, 64
    block = 12 * d * d + 2 * d  # qkv 3d², proj d², fc 4d², its proj 4d², two LayerNorm weights
    root = arch.vocab_size * d + arch.seq_len * d + d  # tied embedding, positions, final LayerNorm
    assert arch.tie_weights and not arch.bias
    params = 2 * block + root
    got = config_memory(cfg, model, 2, sharded=True, cpu_offload=False, cpu_ranks=False)
    assert got.params == params and got.state == params * 16 // 2
    assert got.gathered == 2 * (root + 2 * block)
    tokens, e, f, V = 4 * arch.seq_len, 2, 4 * d, arch.vocab_size
    assert got.activations == tokens * (e * (2 * d + 8 * d + 2 * f + 2 * d + V) + 4 * V)
    ddp = config_memory(cfg, model, 2, sharded=False, cpu_offload=False, cpu_ranks=False)
    assert (ddp.state, ddp.gathered, ddp.activations) == (params * 18, 0, got.activations)  # + autocast's copy


def _fitting_between(overrides, monkeypatch):
    """A host memory limit between what 2 CPU ranks need under fsdp and under ddp."""
    ddp_cfg, model = _config(overrides)
    fsdp_cfg, _ = _config(overrides + ["parallel=fsdp"])
    ddp = config_memory(ddp_cfg, model, 2, sharded=False, cpu_offload=False, cpu_ranks=True)
    fsdp = config_memory(fsdp_cfg, model, 2, sharded=True, cpu_offload=False, cpu_ranks=True)
    assert fsdp.host < ddp.host
    limit = (2 * fsdp.host + 2 * ddp.host) // 2
    monkeypatch.setattr(checks, "_available_memory", lambda: limit)
    return ddp, fsdp


def test_ddp_is_refused_naming_fsdp_and_the_same_config_plans_under_fsdp(monkeypatch):
    overrides = GPT[:2] + ["model.n_layer=4", "model.d_model=256", "model.n_head=4", "batch_size=2"]
    overrides += ["launcher.nproc_per_node=2", "precision=fp32"]
    ddp, fsdp = _fitting_between(overrides, monkeypatch)
    plan, errors = plan_or_errors(compose(overrides))
    assert plan is None and len(errors) == 1, errors
    assert "under parallel=ddp" in errors[0] and "use parallel=fsdp" in errors[0]
    assert f"about {human_bytes(fsdp.host)} of host memory per rank (" in errors[0]  # fsdp's own figure
    assert f"about {human_bytes(ddp.host)} of host memory per rank" in errors[0]
    plan, errors = plan_or_errors(compose(overrides + ["parallel=fsdp"]))
    assert errors == [] and plan.world_size == 2


def test_a_gpu_too_small_for_ddp_and_fsdp_is_pointed_at_cpu_offload(monkeypatch):
    """One GPU rank (world 1): sharding divides nothing, offloading the state to the host does."""
    cfg, model = _config(GPT + ["precision=bf16"])
    ddp = config_memory(cfg, model, 1, sharded=False, cpu_offload=False, cpu_ranks=False)
    offload = config_memory(cfg, model, 1, sharded=True, cpu_offload=True, cpu_ranks=False)
    monkeypatch.setattr(checks, "_gpu_memory", lambda launcher, ranks: (ddp.device + offload.device) // 2)
    monkeypatch.setattr(checks, "_available_memory", lambda: 64 * GIB)
    errors = checks.memory_errors(cfg, 1, "nccl")
    assert len(errors) == 1 and "of GPU memory per rank, more than the GPU's" in errors[0], errors
    assert "use parallel=fsdp parallel.cpu_offload=true" in errors[0]
    assert f"about {human_bytes(offload.device)} of GPU memory" in errors[0]
    fsdp_cfg, _ = _config(GPT + ["precision=bf16", "parallel=fsdp", "parallel.cpu_offload=true"])
    assert checks.memory_errors(fsdp_cfg, 1, "nccl") == []
    monkeypatch.setattr(checks, "_available_memory", lambda: offload.host // 2)  # the host cannot hold it
    errors = checks.memory_errors(fsdp_cfg, 1, "nccl")
    assert len(errors) == 1 and "of host memory per rank" in errors[0] and "use more ranks" in errors[0], errors


def _local_bytes(tensors):
    total = 0
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        if t.dim() > 0:  # AdamW's `step` counters are scalars, not parameter-sized state
            total += t.numel() * t.element_size()
    return total


def _state_bytes(model, optimizer):
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    moments = [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
    return {"params": _local_bytes(params), "grads": _local_bytes(grads), "optimizer": _local_bytes(moments)}


def _ddp_and_fsdp_bytes(rank, world):
    """The same GPT after one AdamW step under clorch's DDP and under fully_shard: local bytes."""
    from clorch.models import build_model
    from clorch.nn.parallel.ddp import DistributedDataParallel
    from clorch.nn.parallel.fsdp import device_mesh, shard_model

    sizes = dict(vocab_size=32, seq_len=8, n_layer=2, n_head=2, d_model=32)
    idx = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(rank))
    out = {"params": sum(p.numel() for p in build_model("gpt", **sizes).parameters())}
    for name in ("ddp", "fsdp"):
        torch.manual_seed(0)
        model = build_model("gpt", **sizes)
        wrapped = DistributedDataParallel(model) if name == "ddp" else shard_model(model, mesh=device_mesh("cpu"))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        wrapped(idx).float().square().mean().backward()
        optimizer.step()  # the moments exist from the first step on
        out[name] = _state_bytes(model, optimizer)
    return out


def test_sharding_divides_the_measured_state_by_the_shard_count():
    """2 gloo ranks, one launch: parameters, gradients and AdamW's moments each rank holds under
    fsdp are half of ddp's (every dimension here divides by 2, so nothing is padded), and the
    plan's figure, P x 16 / 2, is exactly what a rank keeps."""
    for rank_bytes in run_ranks(_ddp_and_fsdp_bytes, 2, timeout=60):
        ddp, fsdp, params = rank_bytes["ddp"], rank_bytes["fsdp"], rank_bytes["params"]
        assert ddp == {"params": 4 * params, "grads": 4 * params, "optimizer": 8 * params}
        assert {k: 2 * v for k, v in fsdp.items()} == ddp
        assert sum(fsdp.values()) == rank_memory(params, bytes_per_parameter("adamw", sharded=True), shards=2).state


def test_a_shard_class_the_model_does_not_have_is_refused_before_launch_naming_the_classes_it_has():
    overrides = GPT + ["launcher.nproc_per_node=2", "parallel=fsdp", "parallel.shard=[Blok]"]
    plan, errors = plan_or_errors(compose(overrides))
    assert plan is None and len(errors) == 1, errors
    assert errors[0].startswith("parallel.shard=['Blok'] names classes that are not in the model: ['Blok']; ")
    assert "the model has ['Block'," in errors[0] and errors[0].endswith("or use parallel.shard=auto"), errors
    plan, errors = plan_or_errors(compose(overrides[:-1] + ["parallel.shard=[Block]"]))
    assert errors == [] and plan.world_size == 2
