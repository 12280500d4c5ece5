"""Mistakes a new user makes first: each is a config error (exit 2) that says what to type
instead, and leaves no run directory behind."""

from __future__ import annotations

import pytest

from clorch.config.overrides import check_overrides
from clorch.plan.plan import resolve_errors
from tests.clirunner import run_clorch_train_batch

pytestmark = pytest.mark.timeout(120)


def _errors(*overrides: str) -> list[str]:
    return check_overrides(list(overrides), resolve_errors)


def _has(errors: list[str], *parts: str) -> bool:
    return any(all(p in e for p in parts) for e in errors)


@pytest.mark.parametrize(
    "overrides, parts",
    [
        (
            ["checkpoint.dir=myckpt"],
            ["checkpoint.dir='myckpt' does nothing with checkpoint=none", "checkpoint=final or checkpoint=periodic"],
        ),
        (
            ["checkpoint.every_n_steps=20"],
            ["checkpoint.every_n_steps=20 does nothing with checkpoint=none", "choose checkpoint=periodic"],
        ),
        (
            ["checkpoint=final", "checkpoint.keep_last=3"],
            ["checkpoint.keep_last=3 does nothing with checkpoint=final", "choose checkpoint=periodic"],
        ),
        (["checkpoint.path=final.ckpt"], ["checkpoint.path='final.ckpt' does nothing with checkpoint=none"]),
        (
            ["compile_mode=max-autotune"],
            ["compile_mode=max-autotune does nothing with compile=false", "add compile=true"],
        ),
    ],
)
def test_a_key_that_would_do_nothing_is_an_error(overrides, parts):
    errors = _errors(*overrides)
    assert _has(errors, *parts), errors
    assert len(errors) == 1, errors


@pytest.mark.parametrize(
    "overrides",
    [
        ["checkpoint=periodic", "checkpoint.every_n_steps=20", "checkpoint.keep_last=3"],
        ["checkpoint=final", "checkpoint.path=final.ckpt"],
        ["compile=true", "compile_mode=max-autotune-no-cudagraphs"],
    ],
)
def test_the_same_keys_with_their_option_are_fine(overrides, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _errors(*overrides) == []


def test_resuming_from_a_directory_needs_no_checkpoint_policy(tmp_path):
    errors = _errors(f"checkpoint.dir={tmp_path}", "checkpoint.resume=latest")
    assert not _has(errors, "does nothing"), errors


def test_a_recipe_without_its_plus_is_named_with_the_fix():
    errors = _errors("recipe=ddp_bf16", "optim.lr=abc")
    assert errors == [
        "recipe=ddp_bf16 needs a '+': a recipe is added to the defaults, so write +recipe=ddp_bf16",
        "optim.lr must be float, got 'abc'",
    ]


def test_two_recipes_are_named_together():
    errors = _errors("+recipe=ddp_bf16", "+recipe=cpu_smoke")
    assert len(errors) == 1 and _has(errors, "one recipe per run, got 2: +recipe=ddp_bf16, +recipe=cpu_smoke")


def test_an_unusable_backend_is_reported_beside_a_type_error():
    errors = _errors("backend=nccl", "batch_size=abc")
    assert _has(errors, "batch_size must be int, got 'abc'")
    assert _has(errors, "backend=nccl", "needs CUDA")


def test_an_unresolvable_interpolation_names_its_key():
    errors = _errors("optim.lr=${oc.env:CLORCH_TEST_NOT_SET}")
    assert _has(errors, "optim.lr=${oc.env:CLORCH_TEST_NOT_SET} does not resolve", "CLORCH_TEST_NOT_SET"), errors


def test_a_bad_value_in_a_recipe_file_names_the_file(tmp_path):
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("batch_size: abc\nmodel:\n  hidden_features: -3\n")
    errors = _errors(f"+recipe={recipe}")
    assert _has(errors, "batch_size must be int, got 'abc'", f"(set in recipe {recipe})"), errors
    assert _has(errors, "model.hidden_features must be >= 1, got -3", f"(set in recipe {recipe})")
    overridden = _errors(f"+recipe={recipe}", "batch_size=xyz")
    assert _has(overridden, "batch_size must be int, got 'xyz'") and not _has(
        overridden, "got 'xyz'", "set in recipe"
    ), overridden


def test_a_recipe_file_that_is_not_a_mapping_is_named(tmp_path):
    recipe = tmp_path / "notes.yaml"
    recipe.write_text("train the model tomorrow\n")
    errors = _errors(f"+recipe={recipe}")
    assert errors and _has(
        errors, f"recipe {recipe} is not a YAML mapping of config keys", "'train the model tomorrow'"
    ), errors
    assert not _has(errors, "is not a known key"), errors


CLI = [
    (["recipe=ddp_bf16"], ["write +recipe=ddp_bf16"]),
    (["+recipe=ddp_bf16", "+recipe=cpu_smoke"], ["one recipe per run"]),
    (["-m", "recipe=ddp_bf16,cpu_smoke"], ["write +recipe=ddp_bf16,cpu_smoke"]),
    (["optim.lr=${oc.env:CLORCH_TEST_NOT_SET}"], ["optim.lr=${oc.env:CLORCH_TEST_NOT_SET} does not resolve"]),
]


@pytest.fixture(scope="module")
def cli(tmp_path_factory) -> dict[tuple, tuple]:
    """{arguments: (clorch-train's result, its working directory)} for each command of CLI: one
    after the other in one process (tests.clirunner.run_clorch_train_batch), each in an empty
    directory of its own."""
    dirs = [tmp_path_factory.mktemp("slip") for _ in CLI]
    done = run_clorch_train_batch([(args, where) for (args, _), where in zip(CLI, dirs)], timeout=110)
    return {tuple(args): (result, where) for (args, _), result, where in zip(CLI, done, dirs)}


@pytest.mark.parametrize("args, parts", CLI)
def test_clorch_train_exits_2_and_leaves_nothing(args, parts, cli):
    done, tmp_path = cli[tuple(args)]
    assert done.returncode == 2, done.stderr
    assert all(p in done.stderr for p in parts), done.stderr
    assert "Traceback" not in done.stderr and "HYDRA_FULL_ERROR" not in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == [], list(tmp_path.rglob("*"))
