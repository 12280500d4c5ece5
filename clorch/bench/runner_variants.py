"""`clorch-bench runner --variants ...`: clorch's loop with the fast options, beside its bf16 baseline.

Each variant is one more clorch loop in the same interleaved rounds as `plain` and `clorch`
(bf16, the plain output layer), on its own copy of the same seeded model:

* `fused`: `loss=chunked_cross_entropy` (`--chunk-size` tokens a chunk): no logits tensor;
* `fp8`: `precision=fp8`, torchao's float8 Linear layers chosen by `--fp8-min-features`
  (and the first and last Linear kept in bf16, as the config's default);
* `fp8-fused`: both;
* `hf`, `liger` (with `--preset llama-tiny`): a Hugging Face Llama computing its own loss
  (`loss=from_model`), without and with Liger-Kernel's patches (`model.liger=true`).

Besides tokens/s and MFU, each loop reports its peak GPU memory during its own timed blocks
(every loop's weights and optimizer state stay resident, so compare the loops' differences)
and its loss on fixed training batches after the same number of steps as the others.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from clorch.amp.float8 import convert_to_float8
from clorch.data.fused_loss import FusedLossTask
from clorch.models import GPT, GPTConfig
from clorch.nn.fused_loss import fuse_output_loss
from clorch.nn.liger import apply_liger

GPT_VARIANTS = ("fused", "fp8", "fp8-fused")
HF_VARIANTS = ("hf", "liger")
HF_PRESETS = ("llama-tiny",)  # runner.PRESETS that build a Hugging Face model: only HF_VARIANTS run
LLAMA_TINY = dict(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8)


class HFCausalLM(nn.Module):
    """A Hugging Face causal LM as the runner calls a model: `forward(idx)` gives the logits,
    `forward(idx, target=...)` the model's own loss (`loss=from_model`: labels are the input,
    which the model shifts), with GPT's `num_parameters` and `flops_per_token`."""

    def __init__(self, model: nn.Module, seq_len: int):
        super().__init__()
        self.hf, self.seq_len = model, seq_len

    def forward(self, idx: torch.Tensor, target: torch.Tensor | None = None):
        if target is None:
            return self.hf(input_ids=idx).logits
        return self.hf(input_ids=idx, labels=idx).loss

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self) -> int:
        cfg = self.hf.config
        embed = cfg.vocab_size * cfg.hidden_size
        return 6 * (self.num_parameters() - embed) + 12 * cfg.num_hidden_layers * cfg.hidden_size * self.seq_len


def llama_tiny(seq_len: int, seed: int = 0) -> HFCausalLM:
    """A small Llama (about 50M parameters) from transformers, seeded."""
    # transformers is a test extra, not a dependency; only this preset needs it
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as exc:
        raise ImportError(f"--preset llama-tiny needs transformers ({exc})") from exc
    torch.manual_seed(seed)
    config = LlamaConfig(**LLAMA_TINY, max_position_embeddings=seq_len)
    return HFCausalLM(LlamaForCausalLM(config), seq_len)


def variant_model(variant: str, config: GPTConfig | None, opts: dict, device: torch.device) -> nn.Module:
    """The seeded model of a variant, changed as its options say, on `device` (before compile)."""
    if variant in HF_VARIANTS:
        model = llama_tiny(opts["seq_len"])
        if variant == "liger":
            apply_liger(model.hf)
        return model.to(device)
    torch.manual_seed(0)
    model = GPT(config)
    if variant.startswith("fp8"):
        convert_to_float8(model, recipe=opts["fp8_recipe"], min_features=opts["fp8_min_features"])
    if variant.endswith("fused"):
        fuse_output_loss(model, opts["chunk_size"])
    return model.to(device)


class OwnLossTask(FusedLossTask):
    """A task whose training loss the model computes from `model(input, target=...)`."""


def own_loss(variant: str) -> bool:
    """Whether the variant's model computes its loss from `model(input, target=...)` (`OwnLossTask`)."""
    return variant.endswith("fused") or variant in HF_VARIANTS


@torch.no_grad()
def fixed_batch_loss(model: nn.Module, task, device: torch.device, batches: int = 4, batch_size: int = 4) -> float:
    """Mean next-token cross-entropy of the model's logits on the task's first samples (bf16 autocast)."""
    was = model.training
    model.eval()
    total = 0.0
    for b in range(batches):
        rows = task.batch(torch.arange(b * batch_size, (b + 1) * batch_size) % len(task))
        idx, target = rows["input"].to(device), rows["target"].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(idx)
        total += F.cross_entropy(logits.float().flatten(0, 1), target.flatten()).item()
    model.train(was)
    return total / batches


def check_variants(opts: dict) -> list[str]:
    """Errors in `--variants` for the chosen `--preset` (empty: fine)."""
    allowed = HF_VARIANTS if opts["preset"] in HF_PRESETS else GPT_VARIANTS
    errors = [
        f"--variants {v!r} is not one of {', '.join(allowed)} for --preset {opts['preset']}"
        for v in opts["variants"]
        if v not in allowed
    ]
    if opts["preset"] in HF_PRESETS and not opts["variants"]:
        errors.append("--preset llama-tiny runs --variants hf,liger (or one of them)")
    twice = sorted({v for v in opts["variants"] if opts["variants"].count(v) > 1})
    if twice:
        errors.append(f"--variants lists {', '.join(twice)} more than once")
    if opts["fp8_min_features"] < 1:
        errors.append(f"--fp8-min-features must be >= 1, got {opts['fp8_min_features']}")
    if opts["chunk_size"] < 1:
        errors.append(f"--chunk-size must be >= 1, got {opts['chunk_size']}")
    if any(v in ("liger", "fp8", "fp8-fused") for v in opts["variants"]) and opts["device"] != "cuda":
        errors.append("--variants fp8 and liger need --device cuda (float8 and Triton kernels)")
    return errors


def memory_row(peaks: dict[str, float], name: str) -> str:
    """Peak GPU memory of a loop's blocks in GiB ('-' on the CPU)."""
    value = peaks.get(name, 0.0)
    return "-" if not value or math.isnan(value) else f"{value / 2**30:.2f}"
