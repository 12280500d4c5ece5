"""What an option needs of the machine, checked before launch (clorch.plan.machine)."""

from __future__ import annotations

from clorch.config.options.model import TargetModelConfig
from clorch.config.options.precision import FP8Config
from clorch.plan import machine


def test_fp8_on_gpus_below_compute_capability_8_9_names_what_they_have(monkeypatch):
    monkeypatch.setattr(machine, "installed", lambda module: True)
    monkeypatch.setattr(machine, "compute_capabilities", lambda devices: [(9, 0), (8, 0), (8, 6)])
    (need,) = FP8Config().needs()
    (error,) = machine._need_errors(need, "nccl", [0, 1, 2])
    assert error.startswith("precision=fp8 needs compute capability 8.9 or more")
    assert error.endswith("these GPUs have 8.0, 8.6")
    monkeypatch.setattr(machine, "compute_capabilities", lambda devices: [(8, 9), (9, 0)])
    assert machine._need_errors(need, "nccl", [0, 1]) == []
    monkeypatch.setattr(machine, "compute_capabilities", lambda devices: None)  # no nvidia-smi: the ranks tell
    assert machine._need_errors(need, "nccl", [0]) == []


def test_a_missing_extra_and_cpu_ranks_are_both_reported(monkeypatch):
    monkeypatch.setattr(machine, "installed", lambda module: False)
    (need,) = TargetModelConfig(target="transformers.AutoModelForCausalLM.from_config", liger=True).needs()
    errors = machine._need_errors(need, "gloo", None)
    assert errors[0] == (
        "model.liger=true needs the liger_kernel package, which is not installed here: "
        "pip install 'clorch[liger]' (it needs a CUDA build of torch)"
    )
    assert "needs CUDA GPUs" in errors[1] and "CPU ranks over gloo" in errors[1]
    assert TargetModelConfig(target="x.Y").needs() == []


def test_installed_finds_without_importing():
    assert machine.installed("json") and not machine.installed("clorch_no_such_module")


def test_the_memory_plan_counts_the_fused_loss_a_chunk_at_a_time():
    from clorch.plan.memory import gpt_activation_bytes

    gpt2 = dict(n_layer=12, d_model=768, mlp_ratio=4, vocab_size=50304, precision="bf16")
    whole = gpt_activation_bytes(16, 1024, **gpt2)
    fused = gpt_activation_bytes(16, 1024, **gpt2, loss_chunk=4096)
    # 16,384 tokens x 50,304 logits x (2 + 4) bytes kept, against 4,096 tokens' worth made at a time
    # (x (2 + 2 + 4) bytes) and a 768-wide fp32 gradient a token
    assert whole - fused == 16384 * 50304 * 6 - (4096 * 50304 * 8 + 16384 * 768 * 4)
