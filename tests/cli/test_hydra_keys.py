"""A config is data: Hydra's callbacks, logging and launcher targets are refused before anything
runs (exit 2), from a recipe or the command line; outputs stay inside a new or clorch-made directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from clorch.cli.hydra_keys import directory_error, hydra_key_errors
from tests.clirunner import run_clorch_train_batch

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
# The /proc directory a process can create nothing in (Linux procfs: for root too); no importable names there.
FDINFO = Path("/proc/self/fdinfo")


def _copy_callback(src: Path, dst: Path) -> str:
    return f"hydra:\n  callbacks:\n    x:\n      _target_: shutil.copyfile\n      src: {src}\n      dst: {dst}\n"


def _callback_recipe(tmp_path: Path) -> list[str]:
    # The chain an attacker wants: a callback writing sitecustomize.py that every rank would import.
    payload = tmp_path / "payload.py"
    payload.write_text(f"open({str(tmp_path / 'RAN')!r}, 'w').close()\n")
    site = tmp_path / "site"
    site.mkdir()
    recipe = tmp_path / "shared_recipe.yaml"
    recipe.write_text("# @package _global_\nepochs: 1\n" + _copy_callback(payload, site / "sitecustomize.py"))
    return [f"+recipe={recipe}", f"hydra.run.dir={tmp_path / 'run'}"]


def _logging_recipe(tmp_path: Path) -> list[str]:
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    recipe = tmp_path / "logs.yaml"
    recipe.write_text(
        "# @package _global_\nhydra:\n  job_logging:\n    handlers:\n      file:\n"
        f"        class: logging.FileHandler\n        filename: {victim}\n        mode: w\n"
    )
    return [f"+recipe={recipe}"]


def _command_line_callbacks(tmp_path: Path) -> list[str]:
    return [
        "+hydra.callbacks.x._target_=shutil.copyfile",
        f"+hydra.callbacks.x.src={__file__}",
        f"+hydra.callbacks.x.dst={tmp_path / 'COPIED'}",
        "hydra.launcher._target_=os.system",
    ]


def _unwritable_run_dir(tmp_path: Path) -> list[str]:
    (tmp_path / "afile").write_text("")
    return [f"hydra.run.dir={tmp_path / 'afile' / 'run'}"]


def _run_together_flags(tmp_path: Path) -> list[str]:
    foreign = tmp_path / "theirs"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("")
    return [
        "--config-d",
        str(tmp_path),
        "--multi",
        f"hydra.sweep.dir={foreign}",
        "-mcjob",
        "--r",
        "--nosuchflag",
        "hydra.mode=MULTIRUN",
    ]


# name: (the test's files made in its own empty directory, then clorch-train's arguments; or the
# arguments and the directory to run in). Each runs through clorch-train's own entry point, all in
# one process (clorch.cli.main per command, tests.clirunner.run_clorch_train_batch); every command
# here ends before a run starts. test_a_config_group_placed_under_hydra_is_refused starts one of
# its own, with `python -m clorch.cli`.
COMMANDS = {
    "callback recipe": _callback_recipe,
    "logging recipe": _logging_recipe,
    "command-line callbacks": _command_line_callbacks,
    "unwritable run dir": _unwritable_run_dir,
    "default dir under /proc": (["-m", "+recipe=cpu_smoke"], FDINFO),
    "unchecked config": lambda tmp: [
        "--config-dir",
        str(tmp),
        "--config-name",
        "mine",
        "--experimental-rerun",
        "x.pickle",
    ],
    "run-together flags": _run_together_flags,
    "short flag with =": (["-c=job", "+recipe=cpu_smoke"], ROOT),
    "refused key and config errors": lambda tmp: [
        "hydra.callbacks.x._target_=os.system",
        "optim.lr=-1",
        "model=nosuch",
    ],
    "-m after --": lambda tmp: ["--", "+recipe=cpu_smoke", "-m"],
    "-c before --": (["-c", "job", "--", "+recipe=cpu_smoke"], ROOT),
}


@pytest.fixture(scope="module")
def cli(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """{name: (clorch-train's result, the directory it ran in)} for every command of COMMANDS."""
    calls, names = [], []
    for name, command in COMMANDS.items():
        if not callable(command) and command[1] == FDINFO and not FDINFO.is_dir():
            continue  # no procfs: the test says so
        if callable(command):
            cwd = tmp_path_factory.mktemp("cli")
            command = (command(cwd), cwd)
        calls.append(command)
        names.append(name)
    done = run_clorch_train_batch(calls, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=110)
    return {name: (result, cwd) for name, result, (_, cwd) in zip(names, done, calls)}


def test_a_recipe_with_a_hydra_callback_is_refused_and_nothing_runs(cli):
    done, tmp_path = cli["callback recipe"]
    recipe, site = tmp_path / "shared_recipe.yaml", tmp_path / "site"
    assert done.returncode == 2, done.stderr
    assert "sets hydra keys, which a recipe may not" in done.stderr and str(recipe) in done.stderr
    assert not (site / "sitecustomize.py").exists() and not (tmp_path / "RAN").exists()
    assert not (tmp_path / "run").exists()


def test_a_recipe_with_a_logging_file_handler_is_refused_and_the_file_kept(cli):
    done, tmp_path = cli["logging recipe"]
    victim = tmp_path / "precious.txt"
    assert done.returncode == 2 and "sets hydra keys" in done.stderr
    assert victim.read_text() == "keep me"


def test_command_line_callbacks_and_targets_are_refused(cli):
    done, tmp_path = cli["command-line callbacks"]
    marker = tmp_path / "COPIED"
    assert done.returncode == 2
    assert "hydra.callbacks.x._target_ is not allowed: a config may not name code" in done.stderr
    assert "hydra.launcher._target_ is not allowed" in done.stderr
    assert not marker.exists()


@pytest.mark.parametrize(
    "arg, message",
    [
        ("+hydra.job_logging.handlers.f.filename=/tmp/x", "hydra.job_logging.handlers.f.filename is not allowed"),
        ("hydra.output_subdir=/tmp/elsewhere", "hydra.output_subdir is not allowed"),
        ("hydra/callbacks=x", "hydra/callbacks=x is not allowed: clorch-train accepts these Hydra groups"),
        ("hydra/launcher=rq", "hydra/launcher=rq is not allowed; choose one of: basic, submitit_local"),
        ("hydra.run.dir=/", "hydra.run.dir=/ is the filesystem root"),
        ("hydra.run.dir=${oc.env:HOME}", "the only interpolation a run directory may use is ${now:...}"),
        ("hydra.launcher.setup=[x]", "hydra.launcher.setup is not allowed; hydra.launcher takes: timeout_min"),
        ("hydra.job.name=../x", "hydra.job.name=../x is not allowed: a name, without '/'"),
        ("hydra.sweep.subdir=../y", "hydra.sweep.subdir=../y is not allowed: a path inside the sweep directory"),
    ],
)
def test_refused_hydra_overrides_are_named(arg, message):
    (error,) = hydra_key_errors([arg])
    assert message in error


def test_allowed_hydra_overrides_pass(tmp_path):
    assert (
        hydra_key_errors(
            [
                f"hydra.run.dir={tmp_path / 'new'}",
                "hydra.job.chdir=true",
                "-m",
                "hydra/launcher=submitit_local",
                "hydra.launcher.tasks_per_node=2",
                "hydra/job_logging=disabled",
                "optim.lr=1e-3",
            ]
        )
        == []
    )


def test_only_the_output_directory_the_command_uses_is_checked(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    assert hydra_key_errors([f"hydra.run.dir={afile}", "-m"]) == []
    assert hydra_key_errors([f"hydra.sweep.dir={afile}"]) == []
    (error,) = hydra_key_errors([f"hydra.sweep.dir={afile}", "--multirun"])
    assert "hydra.sweep.dir=" in error and "is a file" in error
    (error,) = hydra_key_errors([f"hydra.run.dir={afile}"])
    assert "hydra.run.dir=" in error and "is a file" in error


def test_run_directories_must_be_new_empty_or_clorch_made(tmp_path):
    assert directory_error("hydra.run.dir", str(tmp_path / "new")) is None
    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / "summary.json").write_text("{}")
    (tmp_path / "ours" / ".hydra").mkdir()
    assert directory_error("hydra.run.dir", str(tmp_path / "ours")) is None
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "thesis.tex").write_text("")
    assert "holds files clorch did not write (thesis.tex)" in directory_error("hydra.run.dir", str(tmp_path / "theirs"))
    assert "is a file" in directory_error("hydra.run.dir", __file__)


def test_run_directories_that_cannot_be_made_are_refused(tmp_path):
    (tmp_path / "afile").write_text("")
    for key in ("hydra.run.dir", "hydra.sweep.dir"):
        for value in (str(tmp_path / "afile" / "sub"), str(tmp_path / "afile" / "${now:%H-%M}")):
            error = directory_error(key, value)
            assert error is not None and error.startswith(f"{key}={value}: cannot write there")
            assert "afile is not a directory" in error
    assert directory_error("hydra.run.dir", str(tmp_path / "new" / "${now:%H-%M}")) is None
    # A date that completes a name: the file "afile" is no obstacle to "afile12-30".
    assert directory_error("hydra.run.dir", str(tmp_path / "afile") + "${now:%H-%M}") is None


def test_a_writability_probe_is_not_taken_for_a_foreign_file(tmp_path):
    (tmp_path / ".clorch-probe-x1y2").write_text("")
    assert directory_error("hydra.run.dir", str(tmp_path)) is None


def test_unwritable_run_directories_stop_before_launch(cli):
    done, _ = cli["unwritable run dir"]
    assert done.returncode == 2, done.stderr
    assert "hydra.run.dir=" in done.stderr and "Traceback" not in done.stderr
    # The default outputs/DATE/TIME where the current directory is not one that can hold it.
    if not FDINFO.is_dir():
        return  # (Linux procfs: a current directory nothing can be created in, for root too)
    done, _ = cli["default dir under /proc"]
    assert done.returncode == 2, done.stderr
    assert "cannot create the run directory multirun/DATE/TIME under /proc" in done.stderr
    assert "Traceback" not in done.stderr


def test_flags_that_would_load_an_unchecked_config_are_refused(cli):
    done, _ = cli["unchecked config"]
    assert done.returncode == 2
    for flag in ("--config-dir", "--config-name", "--experimental-rerun"):
        assert f"{flag} is not supported by clorch-train" in done.stderr


def test_abbreviated_and_run_together_flags_cannot_slip_past_the_checks(cli):
    done, tmp_path = cli["run-together flags"]
    foreign = tmp_path / "theirs"
    assert done.returncode == 2, done.stderr
    assert "--config-dir is not supported by clorch-train" in done.stderr  # --config-d written in full
    assert "holds files clorch did not write (thesis.tex)" in done.stderr  # --multi counts as -m
    assert "-mcjob: write each short flag and its value separately" in done.stderr
    assert "--r is ambiguous: it could be --resolve, --run" in done.stderr
    assert "--nosuchflag is not a clorch-train flag" in done.stderr
    assert "hydra.mode is not allowed: start a sweep with -m" in done.stderr
    assert sorted(p.name for p in foreign.iterdir()) == ["thesis.tex"]


def test_a_config_group_placed_under_hydra_is_refused(tmp_path):
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "sneaky.yaml").write_text("callbacks: {x: {_target_: builtins.print, _args_: [PWNED]}}\n")
    for arg in ("+recipe@hydra=sneaky", "+recipe@hydra.callbacks=sneaky", "+recipe@_global_.hydra=sneaky"):
        (error,) = hydra_key_errors([arg])
        assert f"{arg} is not allowed: a config group may not be placed under hydra" in error
    done = subprocess.run(
        [sys.executable, "-m", "clorch.cli", "+recipe@hydra=sneaky"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=100,
        env={**os.environ, "PYTHONPATH": str(ROOT), "CLORCH_RECIPE_PATH": str(recipes)},
    )
    assert done.returncode == 2 and "PWNED" not in done.stdout + done.stderr


def test_a_short_flag_with_its_value_after_an_equals_sign_is_read(cli):
    done, _ = cli["short flag with ="]
    assert done.returncode == 0, done.stderr
    assert "backend: gloo" in done.stdout


def test_a_refused_hydra_key_is_reported_with_the_configs_own_errors(cli):
    done, tmp_path = cli["refused key and config errors"]
    assert done.returncode == 2, done.stderr
    assert "3 config error(s)" in done.stderr
    assert "hydra.callbacks.x._target_ is not allowed" in done.stderr
    assert "optim.lr must be > 0, got -1" in done.stderr
    assert "model=nosuch is not allowed; choose one of: gpt, mlp" in done.stderr
    assert list(tmp_path.iterdir()) == []  # no run directory


def test_flags_after_a_double_dash_are_refused_and_the_rest_read_as_overrides(cli):
    done, _ = cli["-m after --"]
    assert done.returncode == 2
    assert "-m comes after '--', so it would be read as an override" in done.stderr
    done, _ = cli["-c before --"]
    assert done.returncode == 0, done.stderr
    assert "backend: gloo" in done.stdout


def test_a_grid_param_without_a_plus_is_told_how_to_write_it():
    # Hydra would refuse it after clorch's checks with its multi-line "Key 'seed' is not in struct".
    [error] = hydra_key_errors(["-m", "hydra.sweeper.params.seed=1,2"])
    assert error == (
        "hydra.sweeper.params.seed=1,2 needs a '+': write '+hydra.sweeper.params.seed=\"1,2\"' "
        "(quoted for Hydra, inside the shell's quotes)"
    )
    assert hydra_key_errors(["-m", '+hydra.sweeper.params.seed="1,2"']) == []
