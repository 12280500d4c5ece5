"""split_size and model_sizes: the same answers and errors as building the task, without building it."""

from __future__ import annotations

import inspect
import itertools

import pytest

import clorch.data.arithmetic as arithmetic
import clorch.data.text as text
from clorch.data.synthetic import SyntheticRegression
from clorch.data.tasks import build_task, model_sizes, split_size

pytestmark = pytest.mark.timeout(60)

SEEDS = (0, 1, 7)


def _outcome(call, *args, **kwargs):
    """`("ok", value)`, or `(error type, message)` when the call raises."""
    try:
        return "ok", call(*args, **kwargs)
    except (ValueError, TypeError) as error:
        return type(error), str(error)


def _built(name, split, seed, kwargs):
    """What building says: `("ok", (len, model_kwargs))` or the error it raises."""
    result = _outcome(build_task, name, split=split, seed=seed, **kwargs)
    if result[0] == "ok":
        return "ok", (len(result[1]), result[1].model_kwargs())
    return result


def _check(name, split, seed, **kwargs):
    """Assert split_size (and for train, seed 0, model_sizes) agree with building; return the outcome."""
    built = _built(name, split, seed, kwargs)
    size = _outcome(split_size, name, split, seed, **kwargs)
    where = f"{name} split={split} seed={seed} {kwargs}"
    assert size == (built if built[0] != "ok" else ("ok", built[1][0])), where
    if split == "train" and seed == 0:
        sizes = _outcome(model_sizes, name, **kwargs)
        assert sizes == (built if built[0] != "ok" else ("ok", built[1][1])), where
    return built


@pytest.mark.parametrize("digits", [1, 2, 3, 4])
@pytest.mark.parametrize("split", ["train", "eval"])
def test_arithmetic_sizes_match_the_built_task(digits, split):
    for seed, sample_count, eval_fraction, seq_len in itertools.product(
        SEEDS, (1, 37), (0.05, 0.5, 0.95), (None, 3 * digits + 3, 20)
    ):
        built = _check(
            "arithmetic",
            split,
            seed,
            sample_count=sample_count,
            digits=digits,
            eval_fraction=eval_fraction,
            seq_len=seq_len,
        )
        assert built[0] == "ok"  # every combination here can be drawn


@pytest.mark.parametrize(
    "split, digits, eval_fraction, sample_count, outcomes",
    [
        ("eval", 1, 0.001, 1, {ValueError}),  # no eval pair among the 100: the draw fails
        ("train", 1, 0.999, 1, {ValueError}),  # no train pair: the draw fails
        ("eval", 2, 0.0001, 3, {"ok", ValueError}),  # ~1 eval pair in 10,000: fails for some seeds
        ("eval", 1, 0.02, 5, {"ok"}),  # a few eval pairs, drawn with replacement
    ],
)
def test_arithmetic_sizes_fail_exactly_when_the_draw_fails(split, digits, eval_fraction, sample_count, outcomes):
    assert outcomes == {
        _check("arithmetic", split, seed, digits=digits, eval_fraction=eval_fraction, sample_count=sample_count)[0]
        for seed in (0, 1, 2)
    }


def test_arithmetic_sizes_default_arguments():
    for split, seed in itertools.product(("train", "eval"), SEEDS):
        _check("arithmetic", split, seed)


def test_arithmetic_sizes_build_no_tokens(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("split_size must not encode samples")

    monkeypatch.setattr(arithmetic, "encode", refuse)
    assert split_size("arithmetic", "eval", 3, sample_count=500, digits=4) == 500
    assert model_sizes("arithmetic", digits=2) == {"vocab_size": 256, "seq_len": 9}


@pytest.fixture
def text_files(tmp_path):
    """Files of sizes around the edges for seq_len 1, 3, 16 and 64, and a few larger ones."""
    sizes = (4, 5, 8, 9, 33, 34, 35, 100, 129, 130, 131, 257, 1000, 4099)
    paths = []
    for size in sizes:
        path = tmp_path / f"bytes_{size}.txt"
        path.write_bytes(bytes(i % 251 for i in range(size)))
        paths.append(path)
    return paths


@pytest.mark.parametrize("split", ["train", "eval"])
def test_text_sizes_match_the_built_task(text_files, split):
    counted = 0
    for path, seq_len, eval_fraction, sample_count in itertools.product(
        text_files, (1, 3, 16, 64), (0.01, 0.1, 0.5, 0.9), (None, 1, 13)
    ):
        seed = 7 if sample_count else 0  # the seed picks offsets only with sample_count
        built = _check(
            "text", split, seed, path=path, seq_len=seq_len, eval_fraction=eval_fraction, sample_count=sample_count
        )
        counted += built[0] == "ok"
    assert counted > 100  # most combinations build, and the rest failed the same way


def test_text_sizes_default_arguments_and_str_paths(text_files):
    for path in text_files:
        for split, seed in itertools.product(("train", "eval"), SEEDS):
            _check("text", split, seed, path=path)
            _check("text", split, seed, path=str(path), seq_len=2)


def test_text_sizes_stat_the_file_without_reading_it(text_files, monkeypatch):
    expected = len(build_task("text", split="train", seed=0, path=text_files[-1], seq_len=16))

    def refuse(*args, **kwargs):
        raise AssertionError("split_size must not read the file")

    monkeypatch.setattr(text.np, "fromfile", refuse)
    assert split_size("text", "train", 0, path=text_files[-1], seq_len=16) == expected
    assert model_sizes("text", path=text_files[-1], seq_len=16) == {"vocab_size": 256, "seq_len": 16}


@pytest.mark.parametrize("split", ["train", "eval"])
def test_synthetic_sizes_match_the_built_task(split):
    for seed, sample_count, in_features, out_features, noise in itertools.product(
        SEEDS, (1, 50), (1, 7), (1, 3), (0.0, 0.5)
    ):
        _check(
            "synthetic",
            split,
            seed,
            sample_count=sample_count,
            in_features=in_features,
            out_features=out_features,
            noise=noise,
        )
    _check("synthetic", split, 0)


@pytest.mark.parametrize(
    "name, split, seed, kwargs",
    [
        ("images", "train", 0, {}),
        ("synthetic", "train", 0, {"samples": 3}),
        ("synthetic", "test", 0, {}),
        ("synthetic", "train", -1, {}),
        ("synthetic", "train", True, {}),
        ("synthetic", "train", 0, {"noise": -0.5}),
        ("synthetic", "train", 0, {"sample_count": 0, "noise": -0.5}),  # the first check wins
        ("synthetic", "train", 0, {"in_features": 2.0}),
        ("arithmetic", "train", 0, {"digits": 12}),
        ("arithmetic", "train", 0, {"digits": 0}),
        ("arithmetic", "train", 0, {"seq_len": 8}),
        ("arithmetic", "train", 0, {"seq_len": 0, "digits": 1}),
        ("arithmetic", "train", 0, {"eval_fraction": 1.5}),
        ("arithmetic", "train", 0, {"eval_fraction": True}),
        ("arithmetic", "eval", 0, {"sample_count": -3}),
        ("arithmetic", "test", 0, {}),
        ("text", "train", 0, {"path": None}),
        ("text", "train", 0, {"path": ""}),
        ("text", "train", 0, {"path": 3}),
        ("text", "train", 0, {"path": "/nonexistent/clorch/corpus.txt"}),
        ("text", "train", 0, {"path": "x", "seq_len": 0}),
        ("text", "train", 0, {"path": "x", "sample_count": 0}),
        ("text", "train", 0, {"path": "x", "eval_fraction": 0}),
        ("text", "test", 0, {"path": "x"}),
        ("text", "train", -2, {"path": "x"}),
        ("text", "train", 0, {"path": "x", "length": 3}),
    ],
)
def test_bad_arguments_raise_what_building_raises(name, split, seed, kwargs):
    built = _check(name, split, seed, **kwargs)
    assert built[0] in (ValueError, TypeError)


def test_text_without_a_path_is_a_type_error():
    # Python's own message names the function it binds to, so only the type is compared.
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'path'"):
        build_task("text", split="train", seed=0)
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'path'"):
        split_size("text", "train", 0)
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'path'"):
        model_sizes("text", seq_len=4)


@pytest.mark.parametrize("cls", [arithmetic.ArithmeticTask, SyntheticRegression, text.ByteTextTask])
def test_sizes_take_the_constructors_arguments(cls):
    # Keeps the defaults of `sizes` from drifting away from the constructor's.
    init = list(inspect.signature(cls.__init__).parameters.values())[1:]  # without self
    assert list(inspect.signature(cls.sizes).parameters.values()) == init
