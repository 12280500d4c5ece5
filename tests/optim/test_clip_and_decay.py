"""optim.grad_clip and optim.decay through clorch's train_step match a hand-written torch loop
(torch.nn.utils.clip_grad_norm_, torch's optimizers over the same param groups) bit for bit."""

from __future__ import annotations

import pytest
import torch

from clorch.config import compose
from clorch.plan.plan import resolve
from clorch.builders.rank_model import build_raw_model
from clorch.train.loop import build_components, train_step

pytestmark = pytest.mark.timeout(60)

STEPS = 6


def _reference_optimizer(name: str, model: torch.nn.Module, decay: str, weight_decay: float):
    params = list(model.parameters())
    if decay == "all":
        groups = [{"params": params, "weight_decay": weight_decay}]
    else:  # nanoGPT's rule
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=0.05, betas=(0.9, 0.95))
    return torch.optim.SGD(groups, lr=0.05, momentum=0.9)


@pytest.mark.parametrize("name,decay,clip", [("adamw", "matrices", 0.05), ("sgd", "all", 0.05), ("adamw", "all", None)])
def test_clorch_steps_as_a_torch_loop_with_clip_grad_norm(name, decay, clip):
    plan = resolve(
        compose(
            [
                "+recipe=cpu_smoke",
                "precision=fp32",
                f"optim={name}",
                "optim.lr=0.05",
                "optim.weight_decay=0.1",
                f"optim.decay={decay}",
                f"optim.grad_clip={'null' if clip is None else clip}",
                "model.depth=3",
            ]
        )
    )
    cfg = plan.config
    parts = build_components(cfg, {"rank": 0, "world_size": 1}, plan.total_steps)
    model = build_raw_model(cfg, parts.task)  # the same seed: the same initial weights
    optimizer = _reference_optimizer(name, model, decay, 0.1)
    assert [len(g["params"]) for g in parts.optimizer.param_groups] == [
        len(g["params"]) for g in optimizer.param_groups
    ]
    generator = torch.Generator().manual_seed(0)
    clipped = 0
    for _ in range(STEPS):
        batch = parts.task.batch(torch.randperm(len(parts.task), generator=generator)[:16])
        result = train_step(parts, [batch])
        parts.task.loss(model, batch).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf") if clip is None else clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        assert torch.equal(result.grad_norm, norm)
        clipped += clip is not None and norm.item() > clip
        for mine, theirs in zip(parts.raw_model.parameters(), model.parameters()):
            assert torch.equal(mine, theirs)
    assert clip is None or clipped > 0  # the clip did act


def test_a_clip_with_step_in_backward_is_refused_before_launch():
    overrides = ["+recipe=cpu_smoke", "precision=fp32", "optim.grad_clip=1.0", "ddp.step_in_backward=true"]
    with pytest.raises(ValueError, match=r"optim.grad_clip=1.0 cannot run with ddp.step_in_backward=true"):
        resolve(compose(overrides))


def test_the_library_defaults_are_the_configs():
    from clorch.config.schema import AdamWConfig, SGDConfig
    from clorch.optim import build_optimizer, param_groups

    model = torch.nn.Linear(3, 2)
    adamw = build_optimizer("adamw", model.parameters(), lr=1e-3)
    sgd = build_optimizer("sgd", model.parameters(), lr=1e-3)
    assert list(adamw.param_groups[0]["betas"]) == AdamWConfig().betas == [0.9, 0.95]
    assert sgd.param_groups[0]["momentum"] == SGDConfig().momentum == 0.9
    assert AdamWConfig().decay == SGDConfig().decay == "matrices"
    assert [g["weight_decay"] for g in param_groups(model, 0.1)] == [0.1, 0.0]
    with pytest.raises(ValueError, match="optim.decay must be one of matrices, all, got 'bias'"):
        param_groups(model, 0.1, "bias")


class _TimmStyleViT(torch.nn.Module):
    """The names timm's VisionTransformer gives its parameters (and a tied output layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.patch_embed = torch.nn.Conv2d(3, 8, 4, stride=4)
        self.cls_token = torch.nn.Parameter(torch.zeros(1, 1, 8))
        self.dist_token = torch.nn.Parameter(torch.zeros(1, 1, 8))
        self.pos_embed = torch.nn.Parameter(torch.zeros(1, 5, 8))
        self.norm = torch.nn.LayerNorm(8)
        self.qkv = torch.nn.Linear(8, 24)
        self.tokens = torch.nn.Embedding(10, 8)
        self.head = torch.nn.Linear(8, 10, bias=False)
        self.head.weight = self.tokens.weight  # tied, as GPT-2's output layer to its embedding


def _decayed(model: torch.nn.Module) -> set[str]:
    from clorch.optim import param_groups

    decayed = {id(p) for p in param_groups(model, 0.1)[0]["params"]}
    return {name for name, p in model.named_parameters() if id(p) in decayed}


def test_matrices_decay_but_embeddings_position_embeddings_tokens_norms_and_biases():
    from clorch.optim import param_groups

    model = _TimmStyleViT()
    assert _decayed(model) == {"patch_embed.weight", "qkv.weight"}
    groups = param_groups(model, 0.1)
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))  # each once
    assert len(param_groups(model, 0.1, "all")[0]["params"]) == len(list(model.parameters()))


def test_matrices_follow_the_rule_on_hugging_face_models():
    transformers = pytest.importorskip("transformers")
    vit = transformers.ViTModel(
        transformers.ViTConfig(
            hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16, image_size=8, patch_size=4
        )
    )
    # Every matrix and kernel (the patch embedding's convolution included) but the class token
    # and the position embeddings (3-d parameters of ViTEmbeddings).
    assert _decayed(vit) == {n for n, p in vit.named_parameters() if p.dim() >= 2} - {
        "embeddings.cls_token",
        "embeddings.position_embeddings",
    }
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=16, n_positions=8, n_layer=1, n_embd=8, n_head=2)
    )
    # Its attention and MLP matrices (Conv1D), not its token and position embeddings (lm_head is wte).
    assert _decayed(gpt2) == {n for n, p in gpt2.named_parameters() if p.dim() == 2} - {
        "transformer.wte.weight",
        "transformer.wpe.weight",
    }
