"""`clorch-train -m`: Optuna's search with pruning, trials side by side, a sweep that is stopped
and continued, and every error before the first trial. Tiny 1-rank CPU trials."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from clorch.sweep.directory import SweepLock
from clorch.train.trial import TrialLink, TrialReporter
from tests.clirunner import run_clorch_train, run_clorch_train_batch, start_clorch_train

pytestmark = pytest.mark.timeout(400)
ROOT = Path(__file__).resolve().parents[2]
TINY = ["+recipe=cpu_smoke", "launcher.nproc_per_node=1", "epochs=100"]
SEARCH = [
    "hydra/sweeper=optuna",
    "optim.lr=tag(log, interval(1e-5, 3e-1))",
    "hydra.sweeper.n_trials=3",
    "hydra.sweeper.sampler.seed=7",
    "hydra.sweeper.pruner=median",
    "hydra.sweeper.min_trials=1",
]
STUDY = [*TINY, "max_steps=30", "eval_every=10", "checkpoint=periodic", "checkpoint.every_n_steps=10", *SEARCH]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _rows(sweep_dir: Path) -> list[dict[str, str]]:
    with open(sweep_dir / "sweep_summary.csv") as f:
        return list(csv.DictReader(f))


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _cut_off_trial(sweep_dir: Path, proc) -> int:
    """Wait for a trial past its first checkpoint, other than trial 0, and name it."""
    deadline = time.monotonic() + 200
    while True:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no trial reached a checkpoint within 200 s"
        for number in (1, 2):
            run_dir = sweep_dir / str(number)
            if list((run_dir / "checkpoints").glob("step_*.ckpt")) and not (run_dir / "summary.json").exists():
                return number
        time.sleep(0.02)


def test_an_optuna_sweep_stopped_and_continued_tries_and_trains_what_the_uninterrupted_one_did(tmp_path):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    done = run_clorch_train(["-m", *STUDY, f"hydra.sweep.dir={whole}"], tmp_path, env=_env(), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = _rows(whole)
    assert {r["status"] for r in rows} <= {"succeeded", "pruned"} and len(rows) == 3
    for row in rows:  # a pruned trial stopped at an eval, and says which
        assert row["objective"] and row["run_dir"] == str(whole / row["job"])
        if row["status"] == "pruned":
            assert row["pruned_at"] == row["steps"] and int(row["steps"]) < 30 and int(row["steps"]) % 10 == 0
    assert re.search(r"best trial \d: eval_loss [\d.]+ \(minimized\) with \+recipe=cpu_smoke", done.stdout)
    rerun = re.search(r"rerun it with: (clorch-train .*)", done.stdout).group(1)
    assert "optim.lr=" in rerun and "hydra" not in rerun
    assert (whole / "optuna.db").exists() and (whole / "sweep_history.png").exists()

    # The same sweep, stopped by Ctrl-C in the middle of a trial, then continued.
    proc = start_clorch_train(["-m", *STUDY, f"hydra.sweep.dir={parts}"], tmp_path, env=_env())
    cut = _cut_off_trial(parts, proc)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stdout + stderr
    command = re.search(r"continue the sweep with: (clorch-train .*)", stderr).group(1)
    assert f"hydra.sweep.dir={parts}" in command
    args = shlex.split(command)[1:]
    again = run_clorch_train(args, tmp_path, env=_env(), timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"continuing the sweep in {parts}" in again.stdout
    assert _summary(parts / str(cut))["resumed_from"], "the cut-off trial resumed from its checkpoint"
    for a, b in zip(_rows(whole), _rows(parts), strict=True):  # same trials, same results, bit for bit
        assert (a["optim.lr"], a["status"], a["steps"]) == (b["optim.lr"], b["status"], b["steps"])
        if a["status"] == "succeeded":
            assert _summary(whole / a["job"])["weights_sha256"] == _summary(parts / b["job"])["weights_sha256"]


def test_a_grid_runs_side_by_side_on_its_own_cores_and_a_failed_trial_stops_no_other(tmp_path):
    sweep_dir = tmp_path / "grid"
    # Trial 1's whole-job limit runs out at once (timed_out); trial 0 trains.
    args = ["-m", *TINY, "max_steps=6", "launcher.timeout=300,0.001", "hydra.sweeper.n_jobs=2"]
    # A clorch-train process of its own, as a user starts it: its trials fork from its server.
    done = subprocess.run(
        [sys.executable, "-m", "clorch.cli", *args, f"hydra.sweep.dir={sweep_dir}"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert [r["status"] for r in _rows(sweep_dir)] == ["succeeded", "timed_out"]
    cores = dict(re.findall(r"trial (\d) started on cores? ([\d,]+)", done.stdout))
    assert set(cores) == {"0", "1"}, done.stdout
    assert not set(cores["0"].split(",")) & set(cores["1"].split(",")), "two trials shared a core"
    assert "clorch-train: trial 1 timed_out; console output in" in done.stdout
    assert (sweep_dir / "0" / "console.log").read_text().count("clorch-train: succeeded") == 1


def _training(run_dir: Path) -> bool:
    """The trial wrote a train record (its rank is past its first steps)."""
    metrics = run_dir / "metrics.jsonl"
    return metrics.exists() and '"kind": "train"' in metrics.read_text()


def test_ctrl_c_stops_every_trial_running_side_by_side_and_says_how_to_continue(tmp_path):
    sweep_dir = tmp_path / "side"
    long = ["epochs=100000", "max_steps=1000000", "log_every=2", "seed=1,2", "hydra.sweeper.n_jobs=2"]
    proc = start_clorch_train(["-m", *TINY, *long, f"hydra.sweep.dir={sweep_dir}"], tmp_path, env=_env())
    deadline = time.monotonic() + 200
    while not (_training(sweep_dir / "0") and _training(sweep_dir / "1")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the two trials were not both training within 200 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stdout + stderr
    command = re.search(r"continue the sweep with: (clorch-train .*)", stderr).group(1)
    assert f"hydra.sweep.dir={sweep_dir}" in command
    for number in ("0", "1"):  # each stopped as an interrupted run, summary written
        assert _summary(sweep_dir / number)["status"] == "interrupted"


def test_every_sweep_error_is_reported_before_the_first_trial_with_exit_2(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  optim.lr: interval(1e-4, 1e-1)\nstorage: sqlite:////tmp/x.db\n")
    calls = [
        ["optim.lr=choice(fast, slow)"],
        ["optim.lr=interval(1e-1, 1e-4)"],
        ["hydra/sweeper/sampler=annealing", "seed=choice(1,2)"],
        ["hydra.sweeper.pruner=percentile", "seed=choice(1,2)"],
        [f"hydra.sweeper.space={space}"],
        ["hydra.sweeper.n_jobs=64", "seed=choice(1,2)"],
        ["hydra.sweeper.pruner=median", "seed=choice(1,2)"],
    ]
    done = run_clorch_train_batch(
        [(["-m", *TINY, "hydra/sweeper=optuna", *c], tmp_path) for c in calls], env=_env(), timeout=300
    )
    expected = [
        "optim.lr",
        "optim.lr: interval(0.1, 0.0001) must have its lower bound first",
        "hydra/sweeper/sampler=annealing is not allowed; choose one of: tpe, random, grid, cmaes, qmc",
        "hydra.sweeper.pruner=percentile is not allowed; choose one of: none, median, hyperband, asha",
        "storage is not allowed in a search-space file",
        "hydra.sweeper.n_jobs=64 trials of 1 CPU rank(s) need 64 cores at once",
        "hydra.sweeper.pruner=median stops trials at their evals, but they evaluate only at the end",
    ]
    for result, text in zip(done, expected, strict=True):
        assert result.returncode == 2 and text in result.stdout + result.stderr, result.stdout + result.stderr
    assert "fast" in done[0].stdout + done[0].stderr
    assert not (tmp_path / "multirun").exists(), "nothing may start"


def test_the_rank_reports_each_eval_and_the_median_pruner_stops_a_trial_behind_the_others(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=storage, pruner=optuna.pruners.MedianPruner(0, 0))
    for values in ({2: 0.5, 4: 0.4}, {2: 0.6, 4: 0.5}):  # two finished trials
        trial = study.ask()
        for step, value in values.items():
            trial.report(value, step)
        study.tell(trial, values[4])
    behind, ahead = study.ask(), study.ask()
    flags = []

    def broadcast(flag: bool) -> bool:  # one rank: the decision is rank 0's own
        flags.append(flag)
        return flag

    link = dict(storage=storage, study="s", objective="eval_loss", pruner="median", min_trials=0)
    slow = TrialReporter(TrialLink(trial_id=behind._trial_id, **link), rank=0, broadcast_flag=broadcast)
    fast = TrialReporter(TrialLink(trial_id=ahead._trial_id, **link), rank=0, broadcast_flag=broadcast)
    assert slow.should_stop(2, {"loss": 0.9}) is True
    assert fast.should_stop(2, {"loss": 0.1}) is False
    assert flags == [True, False]
    assert optuna.load_study(study_name="s", storage=storage).trials[2].intermediate_values == {2: 0.9}
    assert TrialLink.from_env({"CLORCH_TRIAL": slow.link.to_env()}) == slow.link
    assert TrialLink.from_env({}) is None


def test_a_misspelt_objective_fails_the_sweep_and_a_sweep_in_use_or_changed_is_refused(tmp_path):
    sweep_dir = tmp_path / "objective"

    def sweep(steps: int) -> list[str]:
        return [
            "-m",
            *TINY,
            f"max_steps={steps}",
            "hydra/sweeper=optuna",
            "optim.lr=interval(1e-4, 1e-1)",
            "hydra.sweeper.n_trials=1",
            "hydra.sweeper.objective=eval_los",
            f"hydra.sweep.dir={sweep_dir}",
        ]

    done = run_clorch_train(sweep(2), tmp_path, env=_env(), timeout=200)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "trial 0: hydra.sweeper.objective=eval_los is not in its final metrics (it has: " in done.stdout
    assert "no trial reported the objective eval_los" in done.stdout and "best trial" not in done.stdout
    lock = SweepLock(sweep_dir)  # another sweep runs there
    lock.acquire()
    try:
        (in_use,) = run_clorch_train_batch([(sweep(2), tmp_path)], env=_env(), timeout=120)
    finally:
        lock.release()
    (changed,) = run_clorch_train_batch([(sweep(3), tmp_path)], env=_env(), timeout=120)
    assert in_use.returncode == 2 and f"hydra.sweep.dir={sweep_dir} is in use by another sweep" in in_use.stderr
    assert changed.returncode == 2, changed.stdout + changed.stderr
    assert "max_steps=2 before, max_steps=3 now" in changed.stderr
    assert [r["status"] for r in _rows(sweep_dir)] == ["succeeded"], "the refused sweeps ran nothing"
