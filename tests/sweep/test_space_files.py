"""A search-space file and a storage URL, refused before the first trial in one line naming the
file or key, the value and what is allowed (no process starts here, but one `clorch-train -m`)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from clorch.sweep.checks import read_sweep
from clorch.sweep.settings import MAX_SPACE_FILE, read_space_file, storage_errors

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


def _errors(*overrides: str) -> list[str]:
    return read_sweep(["hydra/sweeper=optuna", *overrides])[1]


def test_a_space_file_names_no_code_at_any_depth(tmp_path):
    path = _file(tmp_path, "sampler: {_target_: os.system, name: tpe}\nparams:\n  seed: [1, 2]\n")
    settings, errors = read_space_file(path)
    assert errors == [f"{path}: sampler._target_ is not allowed: a search-space file never names code"]
    assert settings["sampler"] == {"name": "tpe"}


def test_a_sampler_is_chosen_by_name_on_the_command_line_too():
    assert _errors("seed=choice(1, 2)", "hydra.sweeper.sampler._target_=os.system") == [
        "hydra.sweeper.sampler._target_ is not allowed: samplers are chosen by name, hydra.sweeper.sampler.name=NAME "
        "(one of: tpe, random, grid, cmaes, qmc)"
    ]


def test_a_space_files_sampler_takes_its_keys_only_naming_the_file(tmp_path):
    path = _file(tmp_path, "sampler: {nme: random}\nparams:\n  seed: [1, 2]\n")
    (error,) = _errors(f"hydra.sweeper.space={path}")
    assert error.startswith(f"{path}: sampler.nme is not a key of the sampler; it takes: name, seed"), error


@pytest.mark.parametrize(
    "params, expected",
    [
        (
            "optim: {lr: 'interval(1e-4, 1e-1)'}",
            "params.optim is a mapping; a search space takes one dotted key per parameter, with its grammar as "
            "the value: optim.lr: tag(log, interval(1e-4, 1e-1))",
        ),
        (
            "batch_size: {low: 16, high: 64}",
            "params.batch_size is a mapping (low, high); a range is written in Hydra's grammar: "
            "batch_size: interval(16, 64)",
        ),
        ("+hydra.run.dir: /tmp/elsewhere", "params.+hydra.run.dir is not allowed: a search space may not set Hydra"),
        ("++hydra.job.name: x", "params.++hydra.job.name is not allowed: a search space may not set Hydra"),
        ("~hydra.job.name: x", "params.~hydra.job.name is not allowed"),
    ],
)
def test_a_space_files_wrong_param_is_named_with_the_file_and_the_form_it_takes(tmp_path, params, expected):
    path = _file(tmp_path, f"params:\n  seed: [1, 2]\n  {params}\n")
    errors = _errors(f"hydra.sweeper.space={path}")
    assert len(errors) == 1 and errors[0].startswith(f"{path}: {expected}"), errors


def test_an_unknown_tag_is_refused_naming_the_allowed_one_and_the_file(tmp_path):
    path = _file(tmp_path, "params:\n  optim.lr: tag(logg, interval(1e-4, 1e-1))\n")
    (error,) = _errors(f"hydra.sweeper.space={path}")
    assert error.startswith(f"{path}: optim.lr=tag(logg, interval(1e-4, 1e-1)): tag logg is not known; "), error
    assert "an interval takes the tag: log" in error


def test_a_space_file_that_is_not_a_small_regular_file_is_refused_before_it_is_read(tmp_path):
    assert read_space_file("/dev/zero")[1] == [
        "hydra.sweeper.space=/dev/zero is not a regular file; a search-space file is a YAML file"
    ]
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # opening it to read would wait for a writer
    assert read_space_file(fifo)[1] == [
        f"hydra.sweeper.space={fifo} is not a regular file; a search-space file is a YAML file"
    ]
    assert "is not a regular file" in read_space_file(tmp_path)[1][0]
    big = tmp_path / "big.yaml"
    with big.open("wb") as file:
        file.truncate(MAX_SPACE_FILE + 1)  # sparse: no disk used
    (error,) = read_space_file(big)[1]
    assert error == f"hydra.sweeper.space={big} holds 1,048,577 bytes; a search-space file holds at most 1,048,576"


def test_a_space_file_with_yaml_aliases_is_refused(tmp_path):
    # Levels of nine aliases each: a few hundred bytes that stand for a list of 9**6 strings (each
    # level more multiplies it by nine).
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 6)]
    path = _file(tmp_path, "\n".join(lines) + "\nparams:\n  seed: *a5\n")
    assert read_space_file(path)[1] == [
        f"hydra.sweeper.space={path} uses a YAML alias (*name); a search-space file writes each value out"
    ]


@pytest.mark.parametrize(
    "url, expected",
    [
        ("garbage", "hydra.sweeper.storage=garbage is not a database URL (DIALECT[+DRIVER]://...; e.g. sqlite:"),
        ("redis://localhost:6379", "hydra.sweeper.storage=redis://localhost:6379: redis is not a database SQLAlchemy"),
        ("'sqlite:///x.db?plugin=evil'", "hydra.sweeper.storage=sqlite:///x.db?plugin=evil: ?plugin= is not allowed"),
        ("sqlite:///x.db?plugin=evil", "sqlite:///x.db?plugin=evil: mismatched input '=' expecting <EOF>; a value"),
        ("sqlite://", "hydra.sweeper.storage=sqlite:// is a database in memory, which the trials' processes cannot"),
        ("sqlite:////no/such/folder/x.db", "the folder /no/such/folder does not exist"),
    ],
)
def test_a_bad_storage_url_is_one_line_naming_it_and_what_is_allowed(url, expected):
    (error,) = _errors("seed=choice(1, 2)", f"hydra.sweeper.storage={url}")
    assert error.startswith(expected) or expected in error, error


def test_a_storage_whose_driver_is_not_installed_is_named_with_its_driver_and_no_password():
    driver = next((d for d in ("psycopg", "psycopg2", "pymysql") if importlib.util.find_spec(d) is None), None)
    if driver is None:
        pytest.skip("every driver tried is installed")
    url = {"psycopg": "postgresql+psycopg", "psycopg2": "postgresql+psycopg2", "pymysql": "mysql+pymysql"}[driver]
    (error,) = storage_errors(f"{url}://me:secret@host/db")
    assert error == (
        f"hydra.sweeper.storage={url}://me:***@host/db: its driver {driver} is not installed; "
        "install it, or use sqlite:////PATH"
    )
    assert storage_errors(f"sqlite:///{ROOT}/optuna.db") == [] and storage_errors(None) == []


def test_clorch_train_refuses_them_with_exit_2_before_any_trial(tmp_path):
    from tests.clirunner import run_clorch_train_batch

    space = _file(tmp_path, "sampler: {_target_: os.system}\nparams:\n  optim: {lr: 'interval(1e-4, 1e-1)'}\n")
    calls = [
        ["hydra/sweeper=optuna", f"hydra.sweeper.space={space}"],
        ["hydra/sweeper=optuna", "seed=choice(1,2)", "hydra.sweeper.storage=redis://localhost"],
        ["optim.lr=interval(1e-4,1e-1)", "seed=1,2"],
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = run_clorch_train_batch([(["-m", "+recipe=cpu_smoke", *c], tmp_path) for c in calls], env=env, timeout=120)
    expected = [
        [f"{space}: sampler._target_ is not allowed", f"{space}: params.optim is a mapping"],
        ["hydra.sweeper.storage=redis://localhost: redis is not a database SQLAlchemy knows"],
        ["optim.lr=interval(1e-4,1e-1): the grid (hydra/sweeper=basic) runs listed values", "hydra/sweeper=optuna"],
    ]
    for result, texts in zip(done, expected, strict=True):
        output = result.stdout + result.stderr
        assert result.returncode == 2 and "Traceback" not in output, output
        assert all(text in output for text in texts), output
    assert not (tmp_path / "multirun").exists(), "nothing may start"
