"""The chunked output layer + cross-entropy against the plain linear and F.cross_entropy (fp32, CPU).

Tolerance: 1e-5 relative (fp32 sums in a different order); bf16 is checked under the cuda tier.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from clorch.models.gpt import GPT, GPTConfig
from clorch.nn.fused_loss import IGNORE_INDEX, check_output_protocol, fuse_output_loss, linear_cross_entropy

RTOL, ATOL = 1e-5, 1e-6


def _inputs(n=37, d=24, v=53, bias=True, ignore=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=gen, dtype=torch.float64).float().requires_grad_()
    weight = (0.3 * torch.randn(v, d, generator=gen)).requires_grad_()
    b = (0.1 * torch.randn(v, generator=gen)).requires_grad_() if bias else None
    target = torch.randint(0, v, (n,), generator=gen)
    if ignore:
        target[::5] = IGNORE_INDEX
    return hidden, weight, b, target


def _grads(loss, tensors):
    return torch.autograd.grad(loss, [t for t in tensors if t is not None])


@pytest.mark.parametrize("chunk", [1, 8, 37, 1000])
@pytest.mark.parametrize("bias", [True, False])
def test_value_and_gradients_match_the_plain_loss(chunk, bias):
    hidden, weight, b, target = _inputs(bias=bias)
    plain = F.cross_entropy(F.linear(hidden, weight, b), target, ignore_index=IGNORE_INDEX)
    fused = linear_cross_entropy(hidden, weight, target, b, chunk_size=chunk)
    torch.testing.assert_close(fused, plain, rtol=RTOL, atol=ATOL)
    for got, want in zip(_grads(fused * 1.7, (hidden, weight, b)), _grads(plain * 1.7, (hidden, weight, b))):
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)


def test_leading_dimensions_and_no_grad_path():
    hidden, weight, _, target = _inputs(n=24, ignore=False)
    h3, t3 = hidden.detach().view(2, 12, -1), target.view(2, 12)
    plain = F.cross_entropy(F.linear(h3, weight).flatten(0, 1), t3.flatten())
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy(h3, weight, t3, chunk_size=5), plain, rtol=RTOL, atol=ATOL)


def test_every_target_ignored_is_zero_not_nan():
    hidden, weight, _, target = _inputs(n=6, bias=False)
    loss = linear_cross_entropy(hidden, weight, torch.full_like(target, IGNORE_INDEX), chunk_size=4)
    loss.backward()
    assert loss.item() == 0.0 and torch.all(hidden.grad == 0)


def test_bad_arguments_name_the_rule():
    hidden, weight, _, target = _inputs(n=6, bias=False)
    with pytest.raises(ValueError, match="chunk_size must be an int >= 1"):
        linear_cross_entropy(hidden, weight, target, chunk_size=0)
    with pytest.raises(ValueError, match="target shape"):
        linear_cross_entropy(hidden, weight, target[:3], chunk_size=2)


def _gpt(seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=61, seq_len=16, n_layer=2, n_head=2, d_model=32, **kw))


@pytest.mark.parametrize("tie", [True, False])
def test_gpt_fused_forward_matches_logits_and_keeps_state_dict(tie):
    plain, fused = _gpt(tie_weights=tie), _gpt(tie_weights=tie)
    keys = list(fused.state_dict())
    fuse_output_loss(fused, chunk_size=7)
    assert list(fused.state_dict()) == keys
    gen = torch.Generator().manual_seed(1)
    idx, target = torch.randint(0, 61, (3, 16), generator=gen), torch.randint(0, 61, (3, 16), generator=gen)
    torch.testing.assert_close(fused(idx), plain(idx))  # no target: the logits, for evaluation
    want = F.cross_entropy(plain(idx).flatten(0, 1), target.flatten())
    got = fused(idx, target=target)
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    want.backward()
    got.backward()
    for (name, p), q in zip(plain.named_parameters(), fused.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


class _Custom(nn.Module):
    """A model of one's own following the protocol, with an output bias."""

    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Linear(8, 16), nn.Linear(16, 11)

    def forward_hidden(self, x):
        return torch.tanh(self.body(x))

    @property
    def output_weight(self):
        return self.head.weight

    @property
    def output_bias(self):
        return self.head.bias

    def forward(self, x):
        return self.head(self.forward_hidden(x))


def test_a_model_of_ones_own_through_the_protocol():
    torch.manual_seed(0)
    model = _Custom()
    x, target = torch.randn(4, 5, 8), torch.randint(0, 11, (4, 5))
    want = F.cross_entropy(model(x).flatten(0, 1), target.flatten())
    got = fuse_output_loss(model, chunk_size=3)(x, target=target)
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)


def test_a_model_without_the_protocol_is_refused_naming_what_is_missing():
    with pytest.raises(TypeError, match="forward_hidden.*output_weight.*Linear has not"):
        check_output_protocol(nn.Linear(3, 4))
    with pytest.raises(ValueError, match="loss.chunk_size"):
        fuse_output_loss(_Custom(), chunk_size=0)


@pytest.mark.timeout(300)
def test_compiles_without_graph_breaks():
    model = fuse_output_loss(_gpt(), chunk_size=16)
    gen = torch.Generator().manual_seed(2)
    idx, target = torch.randint(0, 61, (2, 16), generator=gen), torch.randint(0, 61, (2, 16), generator=gen)
    want = model(idx, target=target)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    got = compiled(idx, target=target)
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    got.backward()
    assert model.output_weight.grad is not None


@pytest.mark.timeout(300)
def test_bf16_autocast_compiled_matches_the_plain_loss_to_bf16_tolerance():
    """Under autocast the products run in bf16 as the plain layer's do; both read bf16 logits."""
    hidden, weight, b, target = _inputs(n=64, d=32, v=97)
    fused = torch.compile(
        lambda h, w, t, bias: linear_cross_entropy(h, w, t, bias, chunk_size=16), fullgraph=True, backend="aot_eager"
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = fused(hidden, weight, target, b)
        want = F.cross_entropy(F.linear(hidden, weight, b).float(), target, ignore_index=IGNORE_INDEX)
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    for g, w in zip(_grads(got, (hidden, weight, b)), _grads(want, (hidden, weight, b))):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-3)
