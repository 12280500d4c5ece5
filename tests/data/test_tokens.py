"""Token files as nanoGPT and llm.c write them: read through a memory map, windows, splits, checks."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from clorch.config import compose
from clorch.plan.plan import resolve_errors
from clorch.data.tasks import build_task, split_size
from clorch.data.tokens import TokenFileTask, largest_token


def _nanogpt(path, ids, dtype=np.uint16):
    np.asarray(ids, dtype=dtype).tofile(path)
    return str(path)


def _llmc(path, ids):
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [20240520, 1, len(ids)]
    path.write_bytes(header.tobytes() + np.asarray(ids, dtype=np.uint16).tobytes())
    return str(path)


@pytest.fixture
def ids():
    return np.random.default_rng(3).integers(0, 1000, size=5000)


def test_windows_are_the_file_shifted_by_one(tmp_path, ids):
    task = TokenFileTask(_nanogpt(tmp_path / "train.bin", ids), seq_len=16, vocab_size=1000)
    batch = task.batch([0, 2])
    assert batch["input"].dtype == torch.int64 and batch["input"].shape == (2, 16)
    assert batch["input"][1].tolist() == ids[32:48].tolist()
    assert batch["target"][1].tolist() == ids[33:49].tolist()
    held = int(np.ceil(5000 * 0.1))  # the train file's tail is the eval split without eval_path
    assert (
        len(task)
        == (5000 - held - 17) // 16 + 1
        == split_size("tokens", "train", 0, train_path=str(tmp_path / "train.bin"), seq_len=16, vocab_size=1000)
    )
    eval_task = TokenFileTask(str(tmp_path / "train.bin"), seq_len=16, vocab_size=1000, split="eval")
    assert eval_task.batch([0])["input"][0].tolist() == ids[5000 - held : 5000 - held + 16].tolist()


def test_llmc_header_and_uint32_files_read_the_same_tokens(tmp_path, ids):
    plain = TokenFileTask(_nanogpt(tmp_path / "a.bin", ids), seq_len=8, vocab_size=1000)
    llmc = TokenFileTask(_llmc(tmp_path / "b.bin", ids), seq_len=8, vocab_size=1000)
    wide = TokenFileTask(_nanogpt(tmp_path / "c.bin", ids, np.uint32), seq_len=8, vocab_size=1000, dtype="uint32")
    for task in (llmc, wide):
        assert torch.equal(task.batch(list(range(10)))["input"], plain.batch(list(range(10)))["input"])
    assert largest_token(str(tmp_path / "b.bin")) == int(ids.max())


def test_sampled_windows_are_fixed_by_the_seed(tmp_path, ids):
    path = _nanogpt(tmp_path / "t.bin", ids)
    kwargs = dict(train_path=path, seq_len=8, vocab_size=1000, sample_count=64)
    a, b = (build_task("tokens", split="train", seed=5, **kwargs) for _ in range(2))
    other = build_task("tokens", split="train", seed=6, **kwargs)
    assert torch.equal(a.batch(list(range(64)))["input"], b.batch(list(range(64)))["input"])
    assert not torch.equal(a.batch(list(range(64)))["input"], other.batch(list(range(64)))["input"])


def test_perplexity_is_the_exponent_of_the_exact_loss():
    assert TokenFileTask.derived_metrics({"loss": 2.0}) == {"perplexity": pytest.approx(np.exp(2.0))}


def _errors(tmp_path, *overrides):
    return resolve_errors(compose(["data=tokens", "model=gpt", "data.seq_len=16", "batch_size=4", *overrides]))


def test_bad_token_files_are_refused_before_launch(tmp_path, ids):
    good = _nanogpt(tmp_path / "train.bin", ids)
    (tmp_path / "odd.bin").write_bytes(b"\0" * 21)
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [20240520, 1, 99]  # counts more tokens than the file holds
    (tmp_path / "short.bin").write_bytes(header.tobytes() + b"\0\0" * 10)
    assert _errors(tmp_path, f"data.train_path={good}", "data.vocab_size=1000") == []
    cases = [
        ([], "data.train_path is required for data=tokens"),
        ([f"data.train_path={tmp_path / 'none.bin'}"], "does not exist or is not a file"),
        (
            [f"data.train_path={tmp_path / 'odd.bin'}", "data.dtype=uint32"],
            "holds 21 bytes, not a whole number of uint32 tokens",
        ),
        ([f"data.train_path={tmp_path / 'short.bin'}"], "its llm.c header counts 99 tokens"),
        (
            [f"data.train_path={good}", "data.vocab_size=500"],
            f"holds token id {int(ids.max())}, not below data.vocab_size=500",
        ),
        (
            [f"data.train_path={good}", "data.vocab_size=1000", "model.vocab_size=900"],
            "model.vocab_size=900 is smaller than data=tokens's 1000",
        ),
        ([f"data.train_path={good}", "data.dtype=int8"], "data.dtype"),
    ]
    for overrides, expected in cases:
        errors = _errors(tmp_path, *overrides)
        assert len(errors) == 1 and expected in errors[0], (overrides, errors)


@pytest.mark.timeout(240)
def test_clorch_train_trains_on_token_files_with_eval_perplexity(tmp_path, ids):
    from tests.clirunner import run_clorch_train

    pattern = np.tile(np.arange(100, 150), 400)
    _nanogpt(tmp_path / "train.bin", pattern)
    _nanogpt(tmp_path / "val.bin", pattern[:4000])
    done = run_clorch_train(
        [
            "data=tokens",
            "model=gpt",
            "data.train_path=train.bin",
            "data.eval_path=val.bin",
            "data.seq_len=16",
            "data.vocab_size=160",
            "model.n_layer=1",
            "model.d_model=32",
            "model.n_head=2",
            "max_steps=20",
            "batch_size=8",
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    (summary,) = tmp_path.glob("outputs/*/*/summary.json")
    final = json.loads(summary.read_text())["final"]
    assert final["eval_perplexity"] == pytest.approx(np.exp(final["eval_loss"]))
    assert final["eval_perplexity"] < 160  # better than uniform over the vocabulary
    config = (summary.parent / "config.yaml").read_text()
    assert "seq_len: 16" in config and f"train_path: {tmp_path / 'train.bin'}" in config
