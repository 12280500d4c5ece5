"""Tasks: shapes, determinism, disjoint splits, losses that fall, exact eval sums, errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from clorch.data.arithmetic import ArithmeticTask, decode
from clorch.data.tasks import Task, build_task, finalize_metrics
from clorch.data.synthetic import SyntheticRegression
from clorch.data.text import ByteTextTask
from clorch.data.tokens import TokenFileTask
from clorch.models import build_model

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def text_file(tmp_path):
    gen = torch.Generator().manual_seed(5)
    words = ["héllo", "wörld", "data", "parallel", "ränk", "gloo", "\n"]
    picks = torch.randint(0, len(words), (900,), generator=gen).tolist()
    path = tmp_path / "corpus.txt"
    path.write_text(" ".join(words[i] for i in picks), encoding="utf-8")
    return path


def _all(name, **kwargs):
    return [build_task(name, split=split, seed=3, **kwargs) for split in ("train", "eval")]


def _train(task, model, steps, lr, batch_size=32):
    gen = torch.Generator().manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        batch = task.batch(torch.randint(0, len(task), (batch_size,), generator=gen))
        loss = task.loss(model, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_every_task_follows_the_protocol(text_file):
    tasks = [
        build_task("synthetic", split="train", seed=0, sample_count=64, in_features=8, out_features=3),
        build_task("arithmetic", split="eval", seed=0, sample_count=64, digits=2),
        build_task("text", split="train", seed=0, path=text_file, seq_len=32),
    ]
    for task in tasks:
        assert isinstance(task, Task)
        for indices in ([3, 1, 3], torch.tensor([3, 1, 3])):
            batch = task.batch(indices)
            assert all(v.device.type == "cpu" and v.size(0) == 3 for v in batch.values())
            torch.testing.assert_close(batch, task.batch([3, 1, 3]))
    assert tasks[0].tokens_per_sample is None and tasks[0].model_kwargs() == {"in_features": 8, "out_features": 3}
    assert tasks[1].model_kwargs() == {"vocab_size": 256, "seq_len": 9} and tasks[1].tokens_per_sample == 9
    assert tasks[2].model_kwargs() == {"vocab_size": 256, "seq_len": 32}
    assert tasks[2].batch([0])["input"].dtype == torch.long


def test_synthetic_is_deterministic_disjoint_and_shares_its_teacher():
    a, b = _all("synthetic", sample_count=200, in_features=6, out_features=2, noise=0.0)
    again = build_task("synthetic", split="train", seed=3, sample_count=200, in_features=6, out_features=2, noise=0.0)
    torch.testing.assert_close(a.batch(range(200)), again.batch(range(200)))
    other = build_task("synthetic", split="train", seed=4, sample_count=200, in_features=6, out_features=2)
    assert not torch.allclose(other.inputs, a.inputs)
    assert not (a.inputs.unsqueeze(1) == b.inputs.unsqueeze(0)).all(-1).any()
    # Without noise both splits obey one affine map: solve it on train, check it on eval.
    design = torch.cat([a.inputs, torch.ones(200, 1)], 1).double()
    solution = torch.linalg.lstsq(design, a.targets.double()).solution
    predicted = torch.cat([b.inputs, torch.ones(200, 1)], 1).double() @ solution
    torch.testing.assert_close(predicted, b.targets.double(), rtol=1e-4, atol=1e-4)


def test_synthetic_loss_falls_when_training_the_mlp():
    task = build_task("synthetic", split="train", seed=1, sample_count=256, in_features=16, out_features=4)
    torch.manual_seed(0)
    model = build_model("mlp", hidden_features=64, **task.model_kwargs())
    losses = _train(task, model, steps=60, lr=1e-2)
    assert sum(losses[-5:]) / 5 < 0.2 * sum(losses[:5]) / 5


def test_arithmetic_samples_are_the_sums_with_the_answer_masked():
    task = ArithmeticTask(sample_count=300, digits=3, seq_len=16, split="train", seed=2)
    batch = task.batch(range(300))
    assert batch["input"].shape == batch["target"].shape == batch["mask"].shape == (300, 16)
    torch.testing.assert_close(batch["input"][:, 1:], batch["target"][:, :-1])
    for i in range(300):
        a, b = int(task.a[i]), int(task.b[i])
        text = f"{a}+{b}={a + b}\n"
        assert decode(task.tokens[i]) == text
        answer = bytes(batch["target"][i][batch["mask"][i]].tolist()).decode()
        assert answer == f"{a + b}\n"


def test_arithmetic_is_deterministic_and_splits_are_disjoint():
    train, evals = _all("arithmetic", sample_count=3000, digits=2)
    again = build_task("arithmetic", split="train", seed=3, sample_count=3000, digits=2)
    assert torch.equal(train.tokens, again.tokens)
    pairs = lambda t: set(zip(t.a.tolist(), t.b.tolist()))  # noqa: E731
    assert pairs(train).isdisjoint(pairs(evals))
    assert len(pairs(evals)) > 1 and len(pairs(train)) > 50  # 2 digits: 10,000 pairs, 10% eval
    other = build_task("arithmetic", split="eval", seed=4, sample_count=3000, digits=2)
    assert pairs(other) != pairs(evals)


def test_arithmetic_loss_falls_for_a_tiny_gpt():
    task = build_task("arithmetic", split="train", seed=0, sample_count=2048, digits=2)
    torch.manual_seed(0)
    model = build_model("gpt", n_layer=1, n_head=2, d_model=32, **task.model_kwargs())
    losses = _train(task, model, steps=25, lr=1e-2, batch_size=16)
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5


class _FixedLogits(nn.Module):
    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def forward(self, idx):
        return self.logits


def test_arithmetic_eval_sums_count_exact_answers_only():
    task = ArithmeticTask(sample_count=8, digits=3, split="eval", seed=1)
    batch = task.batch(range(8))
    target, mask = batch["target"], batch["mask"]
    logits = torch.randn(8, task.seq_len, 256, generator=torch.Generator().manual_seed(0))
    logits += 20 * F.one_hot(target, 256)
    first_answer = mask.float().argmax(1)
    wrong_answer, wrong_prompt = [1, 4, 6], [2, 4]
    for row in wrong_answer:  # a wrong answer digit: not exact
        logits[row, first_answer[row], (target[row, first_answer[row]] + 1) % 256] += 40
    for row in wrong_prompt:  # wrong before '=', which is not graded
        logits[row, 0, (target[row, 0] + 1) % 256] += 40
    sums = task.eval_sums(_FixedLogits(logits), batch)
    assert all(v.dtype == torch.float64 and v.dim() == 0 for v in sums.values())
    assert sums["count"].item() == 8 and sums["exact_sum"].item() == 8 - len(wrong_answer)
    ce = F.cross_entropy(logits.transpose(1, 2), target, reduction="none")
    expected = ((ce * mask).sum(1) / mask.sum(1)).double().sum()
    torch.testing.assert_close(sums["loss_sum"], expected, rtol=1e-5, atol=1e-6)
    metrics = finalize_metrics(sums)
    assert metrics["exact"] == pytest.approx(5 / 8)
    assert metrics["loss"] == pytest.approx(expected.item() / 8)
    assert task.loss(_FixedLogits(logits), batch).item() == pytest.approx(expected.item() / 8, rel=1e-5)


def test_eval_sums_of_shards_add_up_to_the_whole(text_file):
    # What the engine relies on: all_reduce(sums) / count is the full-batch metric.
    torch.manual_seed(0)
    task = build_task("text", split="eval", seed=0, path=text_file, seq_len=16)
    model = build_model("gpt", n_layer=1, n_head=2, d_model=16, **task.model_kwargs())
    parts = [task.eval_sums(model, task.batch(list(chunk))) for chunk in torch.arange(len(task)).chunk(3)]
    whole = task.eval_sums(model, task.batch(range(len(task))))
    summed = {k: sum(p[k] for p in parts) for k in whole}
    torch.testing.assert_close(summed, whole)
    batch = task.batch(range(len(task)))
    expected = F.cross_entropy(model(batch["input"]).transpose(1, 2), batch["target"])
    assert finalize_metrics(whole)["loss"] == pytest.approx(expected.item(), rel=1e-5)


def test_text_windows_are_file_bytes_and_eval_is_the_tail(text_file):
    data = text_file.read_bytes()
    train, evals = (ByteTextTask(text_file, seq_len=20, split=s, seed=0) for s in ("train", "eval"))
    eval_start = len(data) - evals.data.numel()
    assert 0.09 * len(data) <= evals.data.numel() <= 0.11 * len(data) + 1
    assert bytes(train.data.tolist()) == data[:eval_start]
    batch = train.batch([0, len(train) - 1])
    assert bytes(batch["input"][0].tolist()) == data[:20] and bytes(batch["target"][0].tolist()) == data[1:21]
    last = int(train.starts[-1])
    assert bytes(batch["target"][1].tolist()) == data[last + 1 : last + 21] and last + 21 <= eval_start
    sampled = ByteTextTask(text_file, seq_len=20, sample_count=50, split="train", seed=9)
    again = ByteTextTask(text_file, seq_len=20, sample_count=50, split="train", seed=9)
    assert torch.equal(sampled.starts, again.starts) and len(sampled) == 50
    assert int(sampled.starts.max()) + 21 <= eval_start


def test_text_file_errors_name_path_and_size(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(ValueError, match=f"text.path '{missing}' does not exist or is not a file"):
        build_task("text", split="train", seed=0, path=missing)
    short = tmp_path / "short.txt"
    short.write_bytes(b"abcdefghij" * 25)
    with pytest.raises(ValueError) as info:
        build_task("text", split="train", seed=0, path=short, seq_len=128)
    assert f"text.path '{short}' has 250 bytes; it needs at least 258" in str(info.value)


@pytest.mark.parametrize(
    "name, kwargs, error, text",
    [
        ("images", {}, ValueError, "task name must be one of synthetic, arithmetic, text, tokens, got 'images'"),
        ("synthetic", {"samples": 3}, TypeError, "build_task('synthetic') got unknown argument(s) 'samples'"),
        ("synthetic", {"split": "test"}, ValueError, "synthetic.split must be one of train, eval, got 'test'"),
        ("synthetic", {"seed": -1}, ValueError, "synthetic.seed must be a non-negative int, got -1"),
        ("synthetic", {"noise": -0.5}, ValueError, "synthetic.noise must be a number >= 0, got -0.5"),
        ("synthetic", {"sample_count": 0}, ValueError, "synthetic.sample_count must be a positive int, got 0"),
        ("arithmetic", {"digits": 12}, ValueError, "arithmetic.digits must be <= 9, got 12"),
        ("arithmetic", {"seq_len": 8}, ValueError, "arithmetic.seq_len must be >= 12 for digits=3"),
        ("arithmetic", {"eval_fraction": 1.5}, ValueError, "arithmetic.eval_fraction must be a number in (0, 1)"),
    ],
)
def test_bad_arguments_are_named(name, kwargs, error, text):
    args = {"split": "train", "seed": 0, **kwargs}
    with pytest.raises(error) as info:
        build_task(name, **args)
    assert text in str(info.value)


def test_finalize_metrics_needs_a_count():
    with pytest.raises(ValueError, match="eval sums need a positive 'count', got 0"):
        finalize_metrics({"loss_sum": torch.tensor(1.0), "count": 0})


@pytest.mark.parametrize("cls", [SyntheticRegression, ArithmeticTask, ByteTextTask, TokenFileTask])
def test_sizes_takes_the_defaults_of_the_constructor(cls):
    """`sizes()` answers for the task built with the same arguments, defaults included."""
    import inspect

    built = {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items() if k != "self"}
    sized = {k: p.default for k, p in inspect.signature(cls.sizes).parameters.items() if k != "cls"}
    assert built == sized


@pytest.mark.parametrize(
    "cls, schema",
    [
        (SyntheticRegression, "SyntheticDataConfig"),
        (ArithmeticTask, "ArithmeticDataConfig"),
        (ByteTextTask, "TextDataConfig"),
        (TokenFileTask, "TokensDataConfig"),
    ],
)
def test_the_config_defaults_are_the_tasks_own(cls, schema):
    """data=<task> with no other setting builds the task its own defaults build."""
    import dataclasses
    import inspect

    from clorch.config import schema as schemas

    config = getattr(schemas, schema)()
    own = inspect.signature(cls.__init__).parameters
    shared = [f.name for f in dataclasses.fields(config) if f.name in own and not f.name.endswith("path")]
    assert shared, schema
    assert {k: getattr(config, k) for k in shared} == {k: own[k].default for k in shared}
