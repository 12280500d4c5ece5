"""optim.grad_clip and optim.decay through clorch's train_step match a hand-written torch loop
(torch.nn.utils.clip_grad_norm_, torch's optimizers over the same param groups) bit for bit."""

from __future__ import annotations

import pytest
import torch

from clorch.config import compose
from clorch.plan.plan import resolve
from clorch.engine.model_build import build_raw_model
from clorch.engine.loop import build_components, train_step

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
