"""The sweep summary of an interrupted `clorch-train -m`: written all the same, one row per
planned job with its status (succeeded, failed, interrupted, not_started)."""

from __future__ import annotations

import csv
import json
import os
import signal
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from clorch.engine.interrupts import Interrupted, at_interrupt, interrupts_raise
from clorch.sweep.summary import NOT_STARTED, collect, planned_jobs, write_summary
from tests.clirunner import start_clorch_train
from tests.engine.test_interrupts import ARGS, _env, _wait_for_a_checkpoint

pytestmark = pytest.mark.timeout(240)
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def _sweep_config(task: list[str], target: str = BASIC_SWEEPER):
    return OmegaConf.create(
        {
            "hydra": {
                "sweeper": {"_target_": target, "max_batch_size": None, "params": None},
                "overrides": {"task": task},
            }
        }
    )


def test_planned_jobs_are_the_basic_sweepers_combinations_in_its_order():
    planned = planned_jobs(_sweep_config(["+recipe=cpu_smoke", "seed=1,2", "optim.lr=0.1,0.2"]))
    assert planned == [
        ["+recipe=cpu_smoke", "seed=1", "optim.lr=0.1"],
        ["+recipe=cpu_smoke", "seed=1", "optim.lr=0.2"],
        ["+recipe=cpu_smoke", "seed=2", "optim.lr=0.1"],
        ["+recipe=cpu_smoke", "seed=2", "optim.lr=0.2"],
    ]
    assert planned_jobs(_sweep_config(["seed=1,2"], target="hydra_plugins.other.Sweeper")) is None


def _job(sweep_dir: Path, number: int, overrides: list[str], status: str | None) -> None:
    job_dir = sweep_dir / str(number)
    (job_dir / ".hydra").mkdir(parents=True)
    (job_dir / ".hydra" / "overrides.yaml").write_text(OmegaConf.to_yaml(overrides))
    if status is not None:
        (job_dir / "summary.json").write_text(json.dumps({"status": status, "steps": 4, "final": {"loss": 0.5}}))


def test_an_interrupted_sweeps_summary_has_every_planned_job(tmp_path):
    planned = [["+recipe=cpu_smoke", f"seed={s}"] for s in range(5)]
    _job(tmp_path, 0, planned[0], "succeeded")
    _job(tmp_path, 1, planned[1], "failed")
    _job(tmp_path, 2, planned[2], "interrupted")
    _job(tmp_path, 3, planned[3], None)  # stopped before it wrote its summary
    rows = collect(tmp_path, planned, interrupted=True)
    assert [r["status"] for r in rows] == ["succeeded", "failed", "interrupted", "interrupted", NOT_STARTED]
    assert rows[4]["overrides"] == {"recipe": "cpu_smoke", "seed": "4"} and rows[4]["loss"] is None
    assert [r["status"] for r in collect(tmp_path)] == ["succeeded", "failed", "interrupted", "missing"]
    csv_path, md_path = write_summary(tmp_path, planned, interrupted=True)
    with open(csv_path) as f:
        table = list(csv.DictReader(f))
    assert [(r["job"], r["seed"], r["status"]) for r in table] == [
        ("0", "0", "succeeded"),
        ("1", "1", "failed"),
        ("2", "2", "interrupted"),
        ("3", "3", "interrupted"),
        ("4", "4", NOT_STARTED),
    ]
    assert "| 4 | cpu_smoke | 4 | not_started |" in md_path.read_text()


@pytest.fixture
def handlers_restored():
    """interrupts_raise ignores the signals after an interrupt (the process is ending): not pytest's."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_at_interrupt_runs_once_when_an_interrupt_leaves_the_block_unless_cancelled(handlers_restored):
    seen = []
    at_interrupt(lambda exc: seen.append(exc.signal_name))
    with pytest.raises(Interrupted):
        with interrupts_raise():
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises here, in the main thread
    assert seen == ["SIGTERM"]
    with pytest.raises(Interrupted):  # the interrupt ended what the action was for: it is gone
        with interrupts_raise():
            raise Interrupted(signal.SIGINT)
    at_interrupt(lambda exc: seen.append(exc.signal_name))
    with pytest.raises(Interrupted):
        with interrupts_raise():
            raise Interrupted(signal.SIGHUP)
    cancel = at_interrupt(lambda exc: seen.append(exc.signal_name))
    cancel()
    with pytest.raises(Interrupted):
        with interrupts_raise():
            raise Interrupted(signal.SIGINT)
    assert seen == ["SIGTERM", "SIGHUP"]


def test_an_interrupted_sweep_writes_its_summary_with_each_jobs_status(tmp_path):
    sweep_dir = tmp_path / "sweep"
    args = [a for a in ARGS if not a.startswith("epochs=")]
    # Job 0 ends after an epoch, job 1 is interrupted after its first checkpoint, job 2 never starts.
    proc = start_clorch_train(["-m", *args, "epochs=1,100,101", f"hydra.sweep.dir={sweep_dir}"], tmp_path, env=_env())
    _wait_for_a_checkpoint(sweep_dir / "1", proc)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "clorch-train: sweep interrupted by SIGINT; its summary" in stdout, stdout
    assert not (sweep_dir / "2").exists()
    with open(sweep_dir / "sweep_summary.csv") as f:
        table = list(csv.DictReader(f))
    assert [(r["job"], r["epochs"], r["status"]) for r in table] == [
        ("0", "1", "succeeded"),
        ("1", "100", "interrupted"),
        ("2", "101", NOT_STARTED),
    ]
    assert table[0]["loss"] and not table[2]["loss"]
    assert "Traceback" not in stderr


def test_the_objective_column_holds_one_metric_a_cut_off_trials_train_loss_is_not_ranked(tmp_path):
    finals = {0: {"loss": 0.9, "eval_loss": 0.7}, 1: {"loss": 0.2}}  # trial 1 cut off before its eval
    for number, final in finals.items():
        job_dir = tmp_path / str(number)
        (job_dir / ".hydra").mkdir(parents=True)
        (job_dir / ".hydra" / "overrides.yaml").write_text(OmegaConf.to_yaml([f"seed={number}"]))
        status = "succeeded" if number == 0 else "interrupted"
        (job_dir / "summary.json").write_text(json.dumps({"status": status, "steps": 4, "final": final}))
    assert [r["objective"] for r in collect(tmp_path)] == [0.7, None]
    (tmp_path / "0" / "summary.json").write_text(
        json.dumps({"status": "succeeded", "steps": 4, "final": {"loss": 0.9}})
    )
    assert [r["objective"] for r in collect(tmp_path)] == [0.9, 0.2]  # no trial evaluated: the train loss
