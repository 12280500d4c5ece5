"""The loop's pieces in-process (world size 1, no launcher), as a benchmark uses them,
checked against the same math done by hand; and the progress view."""

from __future__ import annotations

import io
import json

import pytest
import torch

from clorch.config import compose
from clorch.plan.plan import resolve
from clorch.train.evaluate import evaluate
from clorch.train.loop import build_components, train_step
from clorch.engine.progress import Progress

pytestmark = pytest.mark.timeout(60)


def _components(*overrides):
    plan = resolve(compose(["+recipe=cpu_smoke", "precision=fp32", "optim=sgd", "optim.momentum=0.0", *overrides]))
    return build_components(plan.config, {"rank": 0, "world_size": 1}, plan.total_steps)


def test_train_step_with_accumulation_matches_one_big_batch():
    c = _components("accumulation=2", "batch_size=8")
    reference = _components("batch_size=16")  # same seed: same initial weights
    indices = torch.randperm(len(c.task), generator=torch.Generator().manual_seed(3))[:16]
    micro = [c.task.batch(indices[:8]), c.task.batch(indices[8:])]
    result = train_step(c, micro)
    assert result.stepped and result.samples == 16 and result.loss.dim() == 0
    ref = train_step(reference, [reference.task.batch(indices)])
    torch.testing.assert_close(result.loss, ref.loss)
    for mine, theirs in zip(c.raw_model.parameters(), reference.raw_model.parameters()):
        torch.testing.assert_close(mine, theirs)
    # And against plain SGD done by hand on a fresh copy.
    fresh = _components()
    batch = fresh.task.batch(indices)
    loss = fresh.task.loss(fresh.raw_model, batch)
    loss.backward()
    with torch.no_grad():
        expected = [p - fresh.optimizer.param_groups[0]["lr"] * p.grad for p in fresh.raw_model.parameters()]
    for mine, want in zip(c.raw_model.parameters(), expected):
        torch.testing.assert_close(mine, want)


def test_evaluate_counts_every_eval_sample_once():
    c = _components()
    metrics = evaluate(c)
    everything = c.eval_task.batch(torch.arange(len(c.eval_task)))
    with torch.no_grad():
        pred = c.raw_model(everything["input"])
    want = (pred - everything["target"]).square().mean(dim=1).mean().item()
    assert metrics["loss"] == pytest.approx(want, rel=1e-6)


def test_train_step_refuses_several_micro_batches_with_cuda_graphs():
    """CUDA graphs overwrite the last forward's outputs, gradients included: no accumulation."""
    import dataclasses

    c = dataclasses.replace(_components("batch_size=4"), cuda_graphs=True)
    batch = c.task.batch(torch.arange(4))
    with pytest.raises(ValueError, match="train_step got 2 micro-batches, but the model replays CUDA graphs"):
        train_step(c, [batch, batch])


def test_train_step_rejects_no_batches():
    with pytest.raises(ValueError, match="micro_batches must hold at least one batch"):
        train_step(_components(), [])


@pytest.mark.parametrize("mode", ["lines", "bar"])
def test_progress_follows_metrics(tmp_path, mode):
    path = tmp_path / "metrics.jsonl"
    stream = io.StringIO()
    progress = Progress(path, total_steps=20, mode=mode, stream=stream)
    progress.poll()  # no file yet
    with open(path, "a") as f:
        f.write(json.dumps({"kind": "train", "step": 10, "loss": 0.5, "samples_per_s": 100.0}) + "\n")
        f.write('{"kind": "train", "st')  # a line still being written is not read
    progress.poll()
    progress.close()
    text = stream.getvalue()
    assert "10/20" in text and "0.5" in text
    assert text.count("10/20") >= 1 and "st\"" not in text


def test_config_keys_reach_the_ddp_model_and_the_task():
    """ddp.step_in_backward, ddp.gradient_as_bucket_view, ddp.overlap_grad_copies and compile reach
    the parts they configure."""
    c = _components("ddp.step_in_backward=true", "ddp.gradient_as_bucket_view=true", "ddp.overlap_grad_copies=true")
    assert c.model._reducer is not None and c.model._reducer.stepper.optimizer is c.optimizer
    assert c.model.gradient_as_bucket_view is True and c.model.overlap_grad_copies is True
    gpt = resolve(
        compose(
            [
                "+recipe=gpt_bf16",
                "compile=true",
                "model.n_layer=1",
                "model.d_model=32",
                "data.digits=2",
                "data.sample_count=256",
                "schedule.warmup_steps=2",
            ]
        )
    )
    parts = build_components(gpt.config, {"rank": 0, "world_size": 1}, gpt.total_steps)
    assert parts.task.compile_loss == "default" and parts.eval_task.compile_loss is False


def test_components_take_one_precision_object():
    """precision=fp16 builds a MixedPrecision whose scaler takes precision.scaler's settings;
    `scaler` and `autocast_dtype` are read-only views of it."""
    import dataclasses

    from clorch.amp import GradScaler, MixedPrecision
    from clorch.train.components import Components

    c = _components("precision=fp16", "precision.scaler.initial_scale=128.0", "precision.scaler.growth_interval=7")
    assert isinstance(c.precision, MixedPrecision) and c.precision.name == "fp16"
    assert c.scaler is c.precision.scaler and c.scaler.get_scale() == 128.0 and c.scaler.growth_interval == 7
    assert c.autocast_dtype == torch.float16
    result = train_step(c, [c.task.batch(torch.arange(4))])
    assert result.stepped is True and c.precision.skipped_steps == 0
    assert dataclasses.replace(c, cuda_graphs=True).precision is c.precision
    fp32 = _components()
    assert fp32.precision.name == "fp32" and fp32.scaler is None and fp32.autocast_dtype is None
    fields = {f.name: getattr(fp32, f.name) for f in dataclasses.fields(Components) if f.name != "precision"}
    scaler = GradScaler("cpu")
    made = Components(**fields, precision=MixedPrecision("fp16", "cpu", scaler=scaler))
    assert made.precision.name == "fp16" and made.scaler is scaler and made.autocast_dtype == torch.float16
    with pytest.raises(TypeError, match="precision"):
        Components(**fields)  # the precision object is required: no older scaler/autocast_dtype pair
    with pytest.raises(AttributeError):
        fp32.scaler = scaler


def test_components_built_by_hand_around_clorch_ddp_adopt_its_strategy():
    """A loop's components made without build_components (as `clorch-bench runner` makes them):
    the strategy is the one of the wrapper they hold, and a step trains as the engine's does."""
    import dataclasses

    from clorch.train.components import Components
    from clorch.nn.parallel import DistributedDataParallel
    from clorch.strategies import DDPStrategy

    built = _components("precision=fp16")
    fields = {f.name: getattr(built, f.name) for f in dataclasses.fields(Components)}
    model = DistributedDataParallel(built.raw_model)
    by_hand = Components(**{**fields, "model": model, "strategy": None})
    assert isinstance(by_hand.strategy, DDPStrategy) and by_hand.strategy.model is model
    assert by_hand.strategy.precision is built.precision and by_hand.strategy.optimizer is built.optimizer
    result = train_step(by_hand, [by_hand.task.batch(torch.arange(4))])
    assert result.stepped is True and result.grad_norm is not None and torch.isfinite(result.grad_norm)
