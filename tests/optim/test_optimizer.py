"""build_optimizer: the right class and settings, fused where it pays, argument errors."""

from __future__ import annotations

import pytest
import torch

from clorch.models import build_model
from clorch.optim import build_optimizer, param_groups

pytestmark = pytest.mark.timeout(60)


def _model():
    torch.manual_seed(0)
    return build_model("mlp", in_features=5, hidden_features=7, out_features=3)


def test_adamw_settings_and_one_step_matches_torch():
    model, twin = _model(), _model()
    ours = build_optimizer("adamw", model.parameters(), lr=1e-2, weight_decay=0.1, betas=(0.8, 0.95))
    group = ours.param_groups[0]
    assert isinstance(ours, torch.optim.AdamW)
    assert (group["lr"], group["weight_decay"], group["betas"], group["fused"]) == (1e-2, 0.1, (0.8, 0.95), False)
    reference = torch.optim.AdamW(twin.parameters(), lr=1e-2, weight_decay=0.1, betas=(0.8, 0.95))
    x = torch.randn(4, 5)
    for m, opt in ((model, ours), (twin, reference)):
        m(x).square().mean().backward()
        opt.step()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q)


def test_sgd_with_momentum_and_param_groups():
    model = build_model("gpt", vocab_size=20, seq_len=4, n_layer=1, n_head=2, d_model=8, bias=True)
    groups = param_groups(model, weight_decay=0.5)
    opt = build_optimizer("sgd", groups, lr=0.1, momentum=0.9)
    assert isinstance(opt, torch.optim.SGD) and opt.param_groups[0]["momentum"] == 0.9
    decayed = {id(p) for p in opt.param_groups[0]["params"]}
    assert [g["weight_decay"] for g in opt.param_groups] == [0.5, 0.0]
    # The matrices decay; the embeddings (tok_emb, tied to lm_head, and pos_emb) and norms do not.
    assert decayed == {id(b.weight) for b in (model.blocks[0].attn.qkv, model.blocks[0].attn.proj)} | {
        id(model.blocks[0].mlp.fc.weight),
        id(model.blocks[0].mlp.proj.weight),
    }
    assert id(model.tok_emb.weight) not in decayed and id(model.ln_f.weight) not in decayed
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


@pytest.mark.parametrize(
    "name, kwargs, text",
    [
        ("adam", {}, "optim name must be one of adamw, sgd, got 'adam'"),
        ("adamw", {"lr": 0.0}, "optim.lr must be a number > 0.0, got 0.0"),
        ("sgd", {"weight_decay": -1}, "optim.weight_decay must be a number >= 0.0, got -1"),
        ("adamw", {"betas": (0.9, 1.0)}, "optim.betas[1] must be a number >= 0.0 and < 1.0, got 1.0"),
        ("adamw", {"betas": (0.9,)}, "optim.betas must be two numbers in [0, 1), got (0.9,)"),
        ("sgd", {"momentum": -0.1}, "optim.momentum must be a number >= 0.0, got -0.1"),
    ],
)
def test_bad_arguments_are_named(name, kwargs, text):
    with pytest.raises(ValueError) as info:
        build_optimizer(name, _model().parameters(), **{"lr": 1e-3, **kwargs})
    assert text in str(info.value)


def test_empty_parameters_and_ignored_settings():
    with pytest.raises(ValueError, match="optim params is empty"):
        build_optimizer("adamw", [], lr=1e-3)
    with pytest.warns(UserWarning, match="optim 'sgd' ignores betas"):
        build_optimizer("sgd", _model().parameters(), lr=1e-3, betas=(0.5, 0.5))
    with pytest.warns(UserWarning, match="optim 'adamw' ignores momentum"):
        build_optimizer("adamw", _model().parameters(), lr=1e-3, momentum=0.9)


@pytest.mark.cuda
def test_fused_by_default_on_cuda():
    model = _model().cuda()
    opt = build_optimizer("adamw", model.parameters(), lr=1e-3)
    assert opt.param_groups[0]["fused"] is True
    model(torch.randn(2, 5, device="cuda")).sum().backward()
    opt.step()
