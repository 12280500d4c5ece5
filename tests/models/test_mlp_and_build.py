"""MLP shapes and errors; `build_model` by name, with its errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from clorch.models import GPT, MLP, build_model

pytestmark = pytest.mark.timeout(60)


def test_depth_one_is_the_seeds_linear_layer():
    model = MLP(depth=1)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(128, 32)]
    x = torch.randn(5, 128)
    torch.testing.assert_close(model(x), x @ linears[0].weight.T + linears[0].bias)


@pytest.mark.parametrize("depth", [2, 3])
def test_deeper_mlp_shapes_and_gelu_between_layers(depth):
    model = MLP(in_features=7, hidden_features=11, out_features=3, depth=depth)
    linears = [m for m in model.net if isinstance(m, nn.Linear)]
    gelus = [m for m in model.net if isinstance(m, nn.GELU)]
    assert len(linears) == depth and len(gelus) == depth - 1
    assert linears[0].in_features == 7 and linears[-1].out_features == 3
    assert all(m.in_features == 11 for m in linears[1:])
    assert model(torch.randn(4, 7)).shape == (4, 3)
    assert model.num_parameters() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "kwargs, text",
    [
        ({"depth": 0}, "MLP.depth must be a positive int, got 0"),
        ({"hidden_features": -4}, "MLP.hidden_features must be a positive int, got -4"),
        ({"in_features": True}, "MLP.in_features must be a positive int, got True"),
        ({"out_features": 2.5}, "MLP.out_features must be a positive int, got 2.5"),
    ],
)
def test_mlp_rejects_bad_sizes(kwargs, text):
    with pytest.raises(ValueError) as info:
        MLP(**kwargs)
    assert text in str(info.value)


def test_build_model_by_name():
    mlp = build_model("mlp", in_features=9, out_features=4, depth=1)
    assert isinstance(mlp, MLP) and mlp(torch.randn(2, 9)).shape == (2, 4)
    gpt = build_model("gpt", vocab_size=40, seq_len=8, n_layer=1, n_head=2, d_model=16)
    assert isinstance(gpt, GPT) and gpt.config.vocab_size == 40 and gpt.config.n_head == 2
    assert gpt(torch.randint(0, 40, (3, 8))).shape == (3, 8, 40)


def test_build_model_unknown_name_lists_the_allowed_ones():
    with pytest.raises(ValueError) as info:
        build_model("resnet")
    assert "model name must be one of mlp, gpt, got 'resnet'" in str(info.value)


@pytest.mark.parametrize(
    "name, kwargs, text",
    [
        ("mlp", {"width": 3}, "build_model('mlp') got unknown argument(s) 'width'; allowed: in_features"),
        ("gpt", {"n_layers": 3}, "build_model('gpt') got unknown argument(s) 'n_layers'; allowed: vocab_size"),
    ],
)
def test_build_model_unknown_argument_is_named(name, kwargs, text):
    with pytest.raises(TypeError) as info:
        build_model(name, **kwargs)
    assert text in str(info.value)


def test_build_model_passes_config_errors_through():
    with pytest.raises(ValueError) as info:
        build_model("gpt", d_model=100, n_head=3)
    assert "GPTConfig.d_model must be divisible by n_head (3), got 100" in str(info.value)
