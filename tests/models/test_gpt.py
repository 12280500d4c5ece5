"""The GPT: config validation, shapes, causality, attention math, init, size, fused kernels."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from clorch.models import GPT, GPTConfig
from clorch.models.gpt import CausalSelfAttention

pytestmark = pytest.mark.timeout(60)

TINY = dict(vocab_size=61, seq_len=16, n_layer=2, n_head=4, d_model=32)


def _tiny(**overrides) -> GPT:
    torch.manual_seed(7)
    return GPT(GPTConfig(**{**TINY, **overrides})).eval()


@pytest.mark.parametrize(
    "kwargs, text",
    [
        ({"vocab_size": 0}, "GPTConfig.vocab_size must be a positive int, got 0"),
        ({"seq_len": -1}, "GPTConfig.seq_len must be a positive int, got -1"),
        ({"n_layer": 2.0}, "GPTConfig.n_layer must be a positive int, got 2.0"),
        ({"d_model": 30, "n_head": 4}, "GPTConfig.d_model must be divisible by n_head (4), got 30"),
        ({"mlp_ratio": 0}, "GPTConfig.mlp_ratio must be a number > 0"),
        ({"dropout": 1.0}, "GPTConfig.dropout must be a number in [0, 1), got 1.0"),
        ({"tie_weights": "yes"}, "GPTConfig.tie_weights must be a bool, got 'yes'"),
    ],
)
def test_config_errors_name_field_value_and_rule(kwargs, text):
    with pytest.raises(ValueError) as info:
        GPTConfig(**kwargs)
    assert text in str(info.value)


def test_gpt_needs_a_config():
    with pytest.raises(TypeError, match="GPT\\(config\\) needs a GPTConfig, got dict"):
        GPT({"vocab_size": 10})


def test_forward_shape_and_input_errors():
    model = _tiny()
    idx = torch.randint(0, 61, (3, 11))
    assert model(idx).shape == (3, 11, 61)
    with pytest.raises(ValueError, match=r"GPT input length must be <= seq_len \(16\), got 17"):
        model(torch.randint(0, 61, (1, 17)))
    with pytest.raises(ValueError, match=r"GPT input idx must be \(batch, time\), got shape \(5,\)"):
        model(torch.randint(0, 61, (5,)))


def test_changing_a_later_token_never_changes_earlier_logits():
    model = _tiny()
    idx = torch.randint(0, 61, (2, 16))
    before = model(idx)
    for t in (0, 5, 15):
        changed = idx.clone()
        changed[:, t] = (changed[:, t] + 1 + torch.randint(0, 59, (2,))) % 61
        after = model(changed)
        torch.testing.assert_close(after[:, :t], before[:, :t], rtol=0, atol=1e-6)
        assert not torch.allclose(after[:, t], before[:, t])  # the change is seen from t on


def test_attention_matches_explicit_masked_softmax():
    config = GPTConfig(**TINY)
    torch.manual_seed(3)
    attn = CausalSelfAttention(config).eval()
    x = torch.randn(2, 9, 32)
    q, k, v = (x @ attn.qkv.weight.T).split(32, dim=-1)
    heads = lambda t: t.view(2, 9, 4, 8).transpose(1, 2)  # noqa: E731
    scores = heads(q) @ heads(k).transpose(-1, -2) / math.sqrt(8)
    scores = scores.masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), float("-inf"))
    y = (scores.softmax(-1) @ heads(v)).transpose(1, 2).reshape(2, 9, 32)
    torch.testing.assert_close(attn(x), y @ attn.proj.weight.T)


def test_runs_under_a_fused_sdpa_kernel():
    # Restricting SDPA to the flash backend fails loudly if q, k, v do not suit a fused kernel.
    model = _tiny()
    idx = torch.randint(0, 61, (2, 16))
    reference = model(idx)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        torch.testing.assert_close(model(idx), reference, rtol=1e-4, atol=1e-4)


def test_tied_weights_count_once_and_untied_add_a_matrix():
    tied, untied = _tiny(), _tiny(tie_weights=False)
    assert tied.lm_head.weight is tied.tok_emb.weight
    assert untied.lm_head.weight is not untied.tok_emb.weight
    assert untied.num_parameters() - tied.num_parameters() == 61 * 32


def test_gpt2_small_has_about_124m_parameters_on_meta():
    config = GPTConfig(vocab_size=50304, seq_len=1024, n_layer=12, n_head=12, d_model=768)
    with torch.device("meta"):
        model = GPT(config)
    d, layers = 768, 12
    per_block = 4 * d * d + 2 * 4 * d * d + 2 * d  # qkv + proj, two MLP matrices, two LayerNorms
    expected = 50304 * d + 1024 * d + layers * per_block + d
    assert model.num_parameters() == expected
    assert 123.5e6 < model.num_parameters() < 125e6
    assert model.num_parameters(exclude_position_embeddings=True) == expected - 1024 * d


def test_gpt2_init_scales_residual_projections():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=512, seq_len=64, n_layer=8, n_head=4, d_model=256))
    residual = torch.cat([p.flatten() for n, p in model.named_parameters() if n.endswith("proj.weight")])
    others = torch.cat([model.blocks[0].attn.qkv.weight.flatten(), model.blocks[0].mlp.fc.weight.flatten()])
    assert residual.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.05)
    assert others.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.pos_emb.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_dropout_is_active_only_in_training():
    model = _tiny(dropout=0.3)
    idx = torch.randint(0, 61, (2, 16))
    torch.testing.assert_close(model(idx), model(idx))
    model.train()
    assert not torch.allclose(model(idx), model(idx))


def test_backward_reaches_every_parameter():
    model = _tiny(bias=True).train()
    idx = torch.randint(0, 61, (4, 16))
    logits = model(idx)
    F.cross_entropy(logits[:, :-1].flatten(0, 1), idx[:, 1:].flatten()).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []


@pytest.mark.cuda
def test_bf16_on_cuda_runs_a_fused_attention_kernel():
    model = GPT(GPTConfig(vocab_size=256, seq_len=128, n_layer=2, n_head=4, d_model=256)).cuda()
    idx = torch.randint(0, 256, (4, 128), device="cuda")
    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    with torch.autocast("cuda", dtype=torch.bfloat16), sdpa_kernel(fused):
        logits = model(idx)
        logits.float().mean().backward()
    assert logits.dtype == torch.bfloat16 and logits.shape == (4, 128, 256)
    assert model.tok_emb.weight.grad is not None
