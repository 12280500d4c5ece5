"""`clorch-train` as users run it: the default job, a sweep with a failing job, bad configs."""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path

import pytest

from clorch.cli import train_main
from tests.clirunner import run_clorch_train, run_clorch_train_batch

pytestmark = pytest.mark.timeout(180)


def _cli(args: list[str], cwd: Path, timeout: float = 150) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return run_clorch_train(args, cwd, env=env, timeout=timeout)


def test_default_command_runs_a_small_job_and_says_where(tmp_path):
    proc = _cli([], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "clorch: running 2 CPU rank(s) over gloo (no CUDA GPU visible), bf16 CPU autocast" in proc.stdout
    (run_dir,) = list((tmp_path / "outputs").glob("*/*"))  # Hydra's outputs/DATE/TIME
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["world_size"] == 2
    assert summary["final"]["loss"] < 0.2  # the synthetic teacher is learned, not just run
    assert (run_dir / ".hydra" / "config.yaml").is_file() and (run_dir / "logs" / "rank_1.stderr").is_file()
    assert "step 64/64" in proc.stderr  # plain progress lines when not on a terminal


def test_sweep_runs_each_job_records_a_failure_and_writes_the_summary(tmp_path):
    # The second job's time limit ends it before it can finish: a failure found only at run time.
    proc = _cli(["-m", "+recipe=cpu_smoke", "launcher.timeout=300,0.2"], tmp_path)
    assert proc.returncode == 1, proc.stderr  # one job failed; the sweep still finished
    (sweep_dir,) = list((tmp_path / "multirun").glob("*/*"))
    with open(sweep_dir / "sweep_summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["recipe"], r["launcher.timeout"], r["status"]) for r in rows] == [
        ("0", "cpu_smoke", "300", "succeeded"),
        ("1", "cpu_smoke", "0.2", "timed_out"),
    ]
    assert float(rows[0]["loss"]) > 0 and float(rows[0]["samples_per_s"]) > 0
    table = (sweep_dir / "sweep_summary.md").read_text()
    assert "| job | recipe | launcher.timeout | status |" in table
    assert "| 1 | cpu_smoke | 0.2 | timed_out |" in table
    assert "timed out" in proc.stderr


def test_bad_config_exits_2_with_every_error_and_no_traceback(tmp_path):
    proc = _cli(["precision=fp4", "ddp.bucket_cap_mb=0", "batch_size=600"], tmp_path)
    assert proc.returncode == 2
    assert "2 config error(s); nothing was launched" in proc.stderr
    assert "precision=fp4 is not allowed; did you mean fp8? choose one of: bf16, fp16, fp32, fp8" in proc.stderr
    assert "ddp.bucket_cap_mb must be > 0 (MiB), got 0" in proc.stderr
    # The config's own errors are reported before torch is imported; the batch against the
    # data's shard, a check that needs torch, comes once they are fixed (as the next test's
    # batch_size=100000 shows).
    assert "batch_size=600" not in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (tmp_path / "outputs").exists()


def test_a_config_error_found_in_the_run_leaves_nothing_behind(tmp_path):
    # Errors found after Hydra started (an unknown key; a batch larger than a shard) in the
    # default directory, a new directory of the user's, and an empty one the user made.
    # The four commands run one after the other in one process (tests.clirunner.run_clorch_train_batch).
    (tmp_path / "mine").mkdir()
    commands = [["precison=bf16", *extra] for extra in ([], ["hydra.run.dir=new/run"], ["hydra.run.dir=mine"])]
    *typos, too_large = run_clorch_train_batch(
        [(args, tmp_path) for args in [*commands, ["batch_size=100000"]]],
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        timeout=170,
    )
    for proc in typos:
        assert proc.returncode == 2 and "did you mean precision?" in proc.stderr, proc.stderr
    proc = too_large
    assert proc.returncode == 2 and "larger than a rank's shard" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]
    assert list((tmp_path / "mine").iterdir()) == []


def test_missing_recipe_file_and_bad_sweep_value_in_process(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert train_main([f"+recipe={tmp_path / 'mine.yaml'}"]) == 2
    assert "no such recipe file" in capsys.readouterr().err
    assert train_main(["-m", "+recipe=cpu_smoke", "optim.lr=1e-3,-2"]) == 2
    assert "optim.lr must be > 0, got -2" in capsys.readouterr().err
    assert not (tmp_path / "multirun").exists()


def test_help_lists_recipes_and_groups(capsys):
    assert train_main(["--help"]) == 0
    out = capsys.readouterr().out
    (recipes,) = [line for line in out.splitlines() if line.startswith("recipe: ")]
    # Recipes registered from a file path earlier in this process are listed too.
    assert {"cpu_smoke", "ddp_bf16", "ddp_fp16", "ddp_fp32", "gpt_bf16"} <= set(recipes[8:].split(", "))
    for group in (
        "precision: bf16, fp16, fp32",
        "checkpoint: final, none, periodic",
        "data: arithmetic, custom, synthetic, text",
        "backend: auto, gloo, nccl",
    ):
        assert group in out


def test_user_recipe_by_path_and_by_directory(tmp_path, monkeypatch, capsys):
    mine = tmp_path / "my_recipes" / "tiny_sgd.yaml"
    mine.parent.mkdir()
    mine.write_text("# @package _global_\ndefaults:\n  - override /optim: sgd\nbatch_size: 8\noptim:\n  lr: 0.05\n")
    monkeypatch.chdir(tmp_path)
    assert train_main([f"+recipe={mine}", "--cfg", "job"]) == 0
    out = capsys.readouterr().out
    assert "name: sgd" in out and "lr: 0.05" in out and "batch_size: 8" in out
    monkeypatch.setenv("CLORCH_RECIPE_PATH", str(mine.parent))
    assert train_main(["+recipe=tiny_sgd", "--cfg", "job"]) == 0
    assert "lr: 0.05" in capsys.readouterr().out


def test_user_recipe_by_path_passes_the_checks_before_launch(tmp_path):
    # The launch path (not --cfg): the rewritten `recipe=file_<stem>` must be an allowed option.
    from clorch.config.composer import rewrite_recipe_overrides
    from clorch.config.overrides import check_overrides

    mine = tmp_path / "wide.yaml"
    mine.write_text("# @package _global_\ndefaults:\n  - override /optim: sgd\nbatch_size: 8\n")
    assert check_overrides(rewrite_recipe_overrides([f"+recipe={mine}", "max_steps=3"])) == []


def test_version_names_clorch_torch_and_hydra(capsys):
    import importlib.metadata

    import hydra

    import clorch

    assert train_main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"clorch {clorch.__version__} ")
    assert f"torch {importlib.metadata.version('torch')}" in out and f"hydra-core {hydra.__version__}" in out


def test_cfg_job_checks_the_config_like_a_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert train_main(["+recipe=cpu_smoke", "batch_size=0", "--cfg", "job"]) == 2
    captured = capsys.readouterr()
    assert "batch_size must be >= 1, got 0" in captured.err and "batch_size:" not in captured.out
    assert train_main(["+recipe=cpu_smoke", "batch_size=4", "--cfg", "job"]) == 0
    assert "batch_size: 4" in capsys.readouterr().out
    assert not (tmp_path / "outputs").exists()  # printing a config makes no run directory


def test_flags_between_overrides_still_work(tmp_path, monkeypatch, capsys):
    # Hydra's command line takes no override after a flag: clorch-train hands it the overrides first
    monkeypatch.chdir(tmp_path)
    assert train_main(["+recipe=cpu_smoke", "--cfg", "job", "batch_size=4", "--res", "max_steps=3"]) == 0
    out = capsys.readouterr().out
    assert "batch_size: 4" in out and "max_steps: 3" in out


def test_hydras_own_help_prints_with_a_recipe_chosen(capsys):
    # Hydra composes its help without the job's config, which a recipe's choices cannot override
    assert train_main(["+recipe=cpu_smoke", "--hydra-help"]) == 0
    assert "Use '--cfg hydra' to Show the Hydra config." in capsys.readouterr().out


def test_two_of_hydras_modes_are_a_config_error_and_an_override_after_info_is_an_override(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    assert train_main(["+recipe=cpu_smoke", "-r", "--cfg", "job", "batch_size=3"]) == 2
    assert "--cfg prints one config and cannot run with -r (a single run): drop one of the two" in (
        capsys.readouterr().err
    )
    assert train_main(["+recipe=cpu_smoke", "--info", "batch_size=4"]) == 0  # --info's value is a word
    assert "batch_size: 4" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
