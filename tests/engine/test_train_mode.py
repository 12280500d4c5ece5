"""The model trains in train mode and evaluates in eval mode, whatever mode its factory left it in:
a factory ending in `.eval()` and Hugging Face's `from_pretrained` (which returns eval mode) train
with dropout, as a plain loop over the same weights does."""

from __future__ import annotations

import pytest
import torch

from clorch.config import compose
from clorch.train.components import build_components, training_seed
from clorch.train.evaluate import evaluate
from clorch.train.loop import train_step
from clorch.builders.model import build_model_for
from clorch.plan.plan import resolve

pytestmark = pytest.mark.timeout(120)


def _first_step(overrides: list[str]) -> tuple:
    """clorch's components for the config, its first step's loss on the first 8 training samples, and that batch."""
    plan = resolve(compose(overrides))
    parts = build_components(plan.config, {"rank": 0, "world_size": 1}, plan.total_steps)
    batch = parts.task.batch(torch.arange(8))
    return plan.config, parts, train_step(parts, [batch]).loss, batch


def test_a_factory_returning_eval_mode_trains_in_train_mode(monkeypatch):
    monkeypatch.setenv("CLORCH_TRUSTED_MODULES", "tests")
    overrides = [
        "+recipe=cpu_smoke",
        "precision=fp32",
        "model._target_=tests.engine.train_mode_models.evaluating",
    ]
    cfg, parts, loss, batch = _first_step(overrides)
    # A plain loop: the same weights (the factory, the same seed), put in train mode, and the
    # rank's stream of training draws (dropout) as clorch seeds it.
    model = build_model_for(cfg, parts.task.model_kwargs())
    assert not model.training  # the factory's mode
    torch.manual_seed(training_seed(cfg.seed, 0))
    expected = parts.task.loss(model.train(), batch)
    assert torch.equal(loss, expected.detach())
    with torch.no_grad():
        assert not torch.equal(loss, parts.task.loss(model.eval(), batch))  # eval mode's loss is another
    metrics = evaluate(parts)
    assert parts.raw_model.training  # back to train mode after evaluating
    assert metrics["loss"] == pytest.approx(_eval_loss(parts, model), rel=1e-6)


def _eval_loss(parts, model) -> float:
    """The eval split's mean loss of `model` (in eval mode) with clorch's weights and statistics."""
    model.load_state_dict(parts.raw_model.state_dict())
    model.eval()
    count, total = 0, 0.0
    with torch.no_grad():
        for start in range(0, len(parts.eval_task), 16):
            batch = parts.eval_task.batch(torch.arange(start, min(start + 16, len(parts.eval_task))))
            n = batch[0].size(0) if isinstance(batch, (tuple, list)) else 16
            total += parts.eval_task.loss(model, batch).item() * n
            count += n
    return total / count


def test_hugging_face_from_pretrained_trains_in_train_mode(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        vocab_size=32, n_positions=16, n_layer=1, n_head=2, n_embd=16, bos_token_id=None, eos_token_id=None
    )  # GPT-2's dropouts are 0.1
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "tiny")
    tokens = tmp_path / "train.bin"
    torch.randint(0, 32, (400,), generator=torch.Generator().manual_seed(0)).numpy().astype("uint16").tofile(tokens)
    monkeypatch.setenv("CLORCH_TRUSTED_MODULES", "transformers")
    cfg, parts, loss, batch = _first_step(
        [
            "+recipe=cpu_smoke",
            "precision=fp32",
            "data=tokens",
            f"data.train_path={tokens}",
            "data.seq_len=12",
            "data.vocab_size=32",
            "batch_size=8",
            "loss=from_model",
            "loss.target_arg=labels",
            "loss.labels=input",
            "++model._target_=transformers.GPT2LMHeadModel.from_pretrained",
            f"++model.pretrained_model_name_or_path={tmp_path / 'tiny'}",
        ]
    )
    model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "tiny")
    assert not model.training  # from_pretrained's mode
    torch.manual_seed(training_seed(cfg.seed, 0))
    expected = model.train()(batch["input"], labels=batch["input"]).loss
    assert torch.equal(loss, expected.detach())
    with torch.no_grad():
        assert not torch.equal(loss, model.eval()(batch["input"], labels=batch["input"]).loss)
