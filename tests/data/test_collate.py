"""Your own collate_fn (data.collate_fn._target_) pads variable-length items, through clorch-train
on 2 gloo ranks; a dict batch in Hugging Face's convention trains as model(**batch) with
loss=from_model, its labels inside, and a classifier's output object reports accuracy."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from clorch.data.from_model import FromModelStep, accuracy_of
from clorch.data.user import DatasetTask
from clorch.train.metrics import read_metrics, without_timing
from tests.clirunner import start_clorch_train
from tests.data.varlen import Lengths, MeanPool, PooledClassifier, pad, pad_hf

pytestmark = pytest.mark.timeout(240)

JOB = [
    "backend=gloo",
    "precision=fp32",
    "launcher.nproc_per_node=2",
    "data._target_=tests.data.varlen.Lengths",
    "batch_size=8",
    "epochs=2",
    "eval_every=4",
    "logger.progress=off",
]
# The same model two ways: MeanPool(input) with torch's cross entropy, and PooledClassifier(**batch),
# which computes the same logits from Hugging Face's keys and returns a SequenceClassifierOutput.
PADDED = ["data.collate_fn._target_=tests.data.varlen.pad", "model._target_=tests.data.varlen.MeanPool"]
KEYWORDS = [
    "data.collate_fn._target_=tests.data.varlen.pad_hf",
    "model._target_=tests.data.varlen.PooledClassifier",
    "loss=from_model",
    "loss.accuracy=true",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pytest.importorskip("transformers")
    tmp = tmp_path_factory.mktemp("collate")
    env = {**os.environ, "CLORCH_TRUSTED_MODULES": "tests", "PYTHONWARNINGS": "ignore"}
    started = {
        name: start_clorch_train([*JOB, *args, f"hydra.run.dir={tmp / name}"], tmp, env=env)
        for name, args in (("padded", [*PADDED, "loss=cross_entropy"]), ("keywords", KEYWORDS))
    }
    done = {}
    for name, proc in started.items():
        out, err = proc.communicate(timeout=200)
        done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done, tmp


def test_a_collate_fn_of_your_own_pads_variable_length_items(runs):
    done, tmp = runs
    assert done["padded"].returncode == 0, done["padded"].stderr
    records = read_metrics(Path(tmp / "padded" / "metrics.jsonl"))
    assert [r["step"] for r in records if r["kind"] == "train"][
        -1
    ] == 8  # 58 training items: 29 a rank, 4 steps an epoch
    assert {"eval_loss", "eval_accuracy"} <= set(records[-1])


def test_a_dict_batch_trains_as_model_keywords_with_its_labels_and_reports_accuracy(runs):
    done, tmp = runs
    assert done["keywords"].returncode == 0, done["keywords"].stderr
    # The same logits, the same cross entropy: the same run, record for record.
    ours = without_timing(read_metrics(Path(tmp / "keywords" / "metrics.jsonl")))
    theirs = without_timing(read_metrics(Path(tmp / "padded" / "metrics.jsonl")))
    assert ours == theirs
    assert "eval_accuracy" in done["keywords"].stdout


def test_accuracy_counts_the_labels_the_logits_rank_first():
    data = Lengths(sample_count=16)
    items = [data[i] for i in range(16)]
    model = PooledClassifier(**data.model_kwargs())
    batch = pad_hf(items)
    loss, metrics = FromModelStep(accuracy=True)(model, batch)
    logits = model(batch["input_ids"], batch["attention_mask"]).logits
    assert torch.equal(loss, torch.nn.functional.cross_entropy(logits, batch["labels"]))
    assert metrics["accuracy"] == (logits.argmax(1) == batch["labels"]).float().mean()
    # Without loss.accuracy the step returns the loss alone; labels of -100 are not counted.
    assert torch.equal(FromModelStep()(model, batch), loss)
    labels = batch["labels"].clone()
    labels[:8] = -100
    assert accuracy_of(logits, labels) == (logits[8:].argmax(1) == labels[8:]).float().mean()
    # A causal LM given its input as labels: the logits at t predict the token at t + 1.
    tokens = torch.tensor([[1, 2, 3]])
    logits = torch.nn.functional.one_hot(torch.tensor([[2, 3, 0]]), 4).float()
    assert accuracy_of(logits, tokens, shifted=True) == 1.0


def test_cross_entropy_takes_the_logits_of_an_output_object():
    data = Lengths(sample_count=16)
    items = [data[i] for i in range(16)]
    plain, wrapped = MeanPool(**data.model_kwargs()), PooledClassifier(**data.model_kwargs())
    wrapped.load_state_dict(plain.state_dict())
    task = DatasetTask(data, loss="cross_entropy")
    batch = pad(items)
    sums = task.eval_sums(plain, batch)

    class Pairs(torch.nn.Module):  # model(input) returning Hugging Face's output object
        def forward(self, ids):
            return wrapped(ids, (ids != 0).long())

    through_object = task.eval_sums(Pairs(), batch)
    assert set(through_object) == set(sums) == {"count", "loss_sum", "accuracy_sum"}
    for key, value in sums.items():
        assert torch.equal(through_object[key], value), key
