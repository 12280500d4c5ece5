"""clorch-train's preflight: only (check and exit 0/1), true (check, then train), auto on several nodes."""

from __future__ import annotations

import re

import json

import pytest

from clorch.config import compose
from clorch.plan.plan import resolve
from tests.clirunner import run_clorch_train

pytestmark = pytest.mark.timeout(240)


def _run(tmp_path, *args, recipe="cpu_smoke"):
    done = run_clorch_train([f"+recipe={recipe}", "logger.progress=off", "hydra.run.dir=run", *args], tmp_path)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    return done, summary


def test_preflight_only_checks_and_exits_0_with_the_table(tmp_path):
    # A GPT on arithmetic: the model is counted on the meta device, its data's sizes on the host
    # (the task draws its pairs).
    done, summary = _run(tmp_path, "preflight=only", recipe="gpt_bf16")
    assert done.returncode == 0, done.stderr
    assert "clorch: preflight only, 2 CPU rank(s)" in done.stdout
    assert "GEMM TFLOP/s" in done.stdout and "preflight passed on 2 rank(s)" in done.stdout
    assert summary["status"] == "succeeded" and summary["steps"] == 0
    assert summary["preflight"]["passed"] and len(summary["preflight"]["ranks"]) == 2
    assert summary["preflight"]["estimate"]["model_params"] > 100_000
    record = json.loads((tmp_path / "run" / "preflight.json").read_text())
    assert record["passed"] and record["table"] == summary["preflight"]["table"]
    assert (
        not (tmp_path / "run" / "metrics.jsonl").exists()
        or "train" not in (tmp_path / "run" / "metrics.jsonl").read_text()
    )  # nothing was trained


def test_a_failed_preflight_exits_1_naming_the_rank_and_trains_nothing(tmp_path):
    # No job passes every check within a millisecond. Which wait fails first depends on how the
    # ranks happen to start (their arrival, or the first all_reduce when both arrive at once);
    # either way the failing rank and its host are named.
    done, summary = _run(tmp_path, "preflight=true", "preflight.timeout_s=0.001")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "preflight failed, nothing was trained" in done.stderr
    assert re.search(r"rank \d+ .*on host|did not arrive within 0\.001 s .*\(on host", done.stderr), done.stderr
    assert summary["status"] == "preflight_failed" and summary["steps"] == 0


def test_preflight_true_checks_then_trains(tmp_path):
    done, summary = _run(tmp_path, "preflight=true", "max_steps=4")
    assert done.returncode == 0, done.stderr
    assert "preflight first, then 4 steps" in done.stdout
    assert summary["status"] == "succeeded" and summary["steps"] == 4 and summary["preflight"]["passed"]
    events = (tmp_path / "run" / "events.jsonl").read_text()
    assert "preflight passed on 2 rank(s)" in events


def test_auto_checks_the_machines_of_a_job_on_more_than_one_node():
    one = resolve(compose(["+recipe=cpu_smoke"]))
    two = resolve(compose(["+recipe=cpu_smoke", "launcher.nnodes=2", "launcher.master_port=29999"]))
    assert (one.preflight, two.preflight) == ("false", "true")
    assert "preflight first (the default on more than one node; preflight=false skips it)" in two.describe()
    off = resolve(compose(["+recipe=cpu_smoke", "launcher.nnodes=2", "launcher.master_port=29999", "preflight=false"]))
    assert off.preflight == "false"
