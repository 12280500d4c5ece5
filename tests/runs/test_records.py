"""Run directories made by hand: damaged, cut short, still running, killed, resumable.

Each case writes the files a run would leave (or their damaged remains) into
tmp_path; `clorch-runs` must list them with what can be told, and never raise.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import yaml

from clorch.runs.cli import run_cli
from clorch.runs.commands import checkpoints, rerun_command, resume_command
from clorch.runs.discover import UsageError, find_runs
from clorch.runs.query import Condition, pick
from clorch.runs.records import Run, short_id

pytestmark = pytest.mark.timeout(60)


def _run_dir(
    root,
    name="outputs/2026-12-01/10-00-00",
    *,
    summary=None,
    job=None,
    config=None,
    metrics=None,
    overrides=None,
    env=None,
):
    path = root / name
    path.mkdir(parents=True)
    if summary is not None:
        (path / "summary.json").write_text(summary if isinstance(summary, str) else json.dumps(summary))
    if job is not None:
        (path / "logs").mkdir()
        (path / "logs" / "job.json").write_text(json.dumps(job))
    (path / "config.yaml").write_text(yaml.safe_dump(config or {"optim": {"lr": 0.01}}))
    if metrics is not None:
        (path / "metrics.jsonl").write_text(metrics)
    if overrides is not None:
        (path / ".hydra").mkdir()
        (path / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if env is not None:
        (path / "env.json").write_text(json.dumps(env))
    return path


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _job(state, pid, host=None):
    return {
        "launcher_pid": pid,
        "host": host or socket.gethostname(),
        "created_at": 1796000000.0,
        "status": {"state": state, "pids": []},
    }


def test_a_damaged_run_is_listed_with_what_its_files_tell(tmp_path, capsys):
    metrics = (
        '{"kind": "train", "step": 2, "loss": 1.5}\n{"kind": "eval", "step": 2, "eval_loss": 1.7}\n'
        '{"kind": "train", "step": 4, "loss": 1.2}\n{"kind": "train", "st'
    )  # cut mid-line
    path = _run_dir(tmp_path, summary='{"status": "succ', metrics=metrics)
    run = Run(path)
    assert run.status == "unknown" and run.steps == 4
    assert run.final == {"step": 4, "loss": 1.2, "eval_loss": 1.7}
    assert run.best == {"step": 2, "eval_loss": 1.7}
    assert run.start is not None and run.start.isoformat() == "2026-12-01T10:00:00"  # from the path
    record = run.record()
    assert any("summary.json cannot be read" in p for p in record["problems"])
    assert any("metrics.jsonl line 4" in p for p in record["problems"])
    assert run_cli(["ls", "--root", str(tmp_path)]) == 0
    assert " unknown " in capsys.readouterr().out


@pytest.mark.parametrize(
    "state, pid, host, stop, status",
    [
        ("running", "self", None, False, "running"),
        ("running", "dead", None, False, "killed"),
        ("running", "dead", None, True, "stopped"),
        ("running", "dead", "another-host", False, "unknown"),
        ("failed", "dead", None, False, "failed"),
    ],
)
def test_without_a_summary_the_launchers_record_and_pid_tell_the_status(tmp_path, state, pid, host, stop, status):
    launcher = os.getpid() if pid == "self" else _dead_pid()
    path = _run_dir(tmp_path, job=_job(state, launcher, host))
    if stop:
        (path / "logs" / "stop.request").write_text("")
    assert Run(path).status == status


def test_a_run_with_a_summary_is_what_its_summary_says(tmp_path):
    path = _run_dir(
        tmp_path, summary={"status": "interrupted", "steps": 3, "run_id": "rec0rded"}, job=_job("running", _dead_pid())
    )
    run = Run(path)
    assert (run.status, run.steps, run.id) == ("interrupted", 3, "rec0rded")
    other = _run_dir(tmp_path, "outputs/2026-12-01/10-00-01", summary={"status": "succeeded"})
    assert Run(other).id == short_id(other) == short_id(str(other) + "/.")


def test_discovery_skips_links_logs_and_checkpoints(tmp_path):
    first = _run_dir(tmp_path)
    (tmp_path / "outputs" / "previous").symlink_to(first, target_is_directory=True)
    (tmp_path / "outputs" / "2026-12-01" / "empty").mkdir()
    assert [r.path for r in find_runs([tmp_path / "outputs"])] == [first.resolve()]


def test_rerun_and_resume_commands(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "step_00000002.ckpt").write_text("")
    (ckpt / "step_00000004.ckpt").write_text("")
    config = {"checkpoint": {"policy": "periodic", "dir": str(ckpt)}, "optim": {"lr": 0.001}}
    path = _run_dir(
        tmp_path,
        job=_job("running", _dead_pid()),
        config=config,
        env={"cwd": "/work/x y"},
        overrides=["+recipe=cpu_smoke", "++optim.lr=0.001", "checkpoint.dir=ckpt"],
    )
    run = Run(path)
    assert run.status == "killed" and [c["step"] for c in checkpoints(run)] == [2, 4]
    # (the re-run names the checkpoint directory absolute: it works pasted anywhere)
    assert rerun_command(run) == (
        "cd '/work/x y' && clorch-train +recipe=cpu_smoke ++optim.lr=0.001 'checkpoint.dir=/work/x y/ckpt'"
    )
    # (the resume goes on in the run's own directory, named absolute)
    assert resume_command(run) == (
        "cd '/work/x y' && clorch-train +recipe=cpu_smoke ++optim.lr=0.001 "
        f"hydra.run.dir={path.resolve()} checkpoint.dir={ckpt} checkpoint.resume=latest"
    )
    typed = ["/venv/bin/clorch-train", "+recipe=/my/r.yaml", "optim.lr=1e-3", "hydra.run.dir=/o/r"]
    (path / "env.json").write_text(json.dumps({"cwd": "/w", "argv": typed}))
    assert rerun_command(Run(path)) == "cd /w && clorch-train +recipe=/my/r.yaml optim.lr=1e-3"
    done = _run_dir(tmp_path, "outputs/2026-12-01/10-00-02", summary={"status": "succeeded"}, config=config)
    assert resume_command(Run(done)) == "not needed: the run completed"


def test_the_rerun_of_a_resumed_run_starts_from_scratch(tmp_path):
    """Its resume command's overrides are left out: pasted, it trains again, it does not resume."""
    config = {"checkpoint": {"policy": "periodic", "dir": "/w/ckpt", "resume": "latest"}, "optim": {"lr": 0.001}}
    typed = ["clorch-train", "+recipe=cpu_smoke", "hydra.run.dir=/o/r", "checkpoint.dir=/w/ckpt"]
    typed += ["checkpoint.resume=latest", "optim.lr=1e-3"]
    path = _run_dir(tmp_path, config=config, summary={"status": "succeeded"}, env={"cwd": "/w", "argv": typed})
    assert rerun_command(Run(path)) == "cd /w && clorch-train +recipe=cpu_smoke optim.lr=1e-3 checkpoint.resume=none"


def test_where_conditions(tmp_path):
    runs = [
        Run(
            _run_dir(
                tmp_path,
                f"outputs/2026-12-01/10-00-0{i}",
                config={"optim": {"lr": lr}},
                summary={"status": "succeeded", "final": {"eval_loss": loss}} if loss else None,
            )
        )
        for i, (lr, loss) in enumerate([(1e-3, 0.05), (3e-3, 0.2), (3e-3, None)])
    ]
    assert [r.path.name for r in pick(runs, ["eval_loss<0.1"])] == ["10-00-00"]
    assert [r.path.name for r in pick(runs, ["optim.lr == 3e-3", "eval_loss!=null"])] == ["10-00-01"]
    assert [r.path.name for r in pick(runs, ["eval_loss=null"])] == ["10-00-02"]
    assert [r.path.name for r in pick(runs, ["start>=2026-12-01T10:00:01"])] == ["10-00-01", "10-00-02"]
    for bad in ("eval_loss", "eval_loss<", "<0.1", "eval loss<1"):
        with pytest.raises(UsageError, match="expected KEY OP VALUE"):
            Condition(bad, runs)


def test_a_sweep_heads_the_full_listing_only(tmp_path, capsys, monkeypatch):
    """Filtered (--status) as sorted (--sort): the table lists the matching runs and no sweep line."""
    sweep = tmp_path / "multirun" / "2026-12-01" / "10-00-00"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("{}\n")
    for number, status in enumerate(["pruned", "succeeded", "pruned"]):
        summary = {"status": status, "final": {"loss": 0.5 - number / 10}}
        _run_dir(tmp_path, f"multirun/2026-12-01/10-00-00/{number}", summary=summary)
    monkeypatch.chdir(tmp_path)

    def statuses(*args):
        assert run_cli(["ls", *args]) == 0
        lines = capsys.readouterr().out.splitlines()[1:]
        return [word for line in lines for word in line.split() if word in ("sweep", "pruned", "succeeded")]

    assert statuses() == ["sweep", "pruned", "succeeded", "pruned"]
    assert statuses("--status", "pruned") == ["pruned", "pruned"]
    assert statuses("--sort", "loss") == ["pruned", "succeeded", "pruned"]


def test_a_side_by_side_trials_rerun_names_its_recipe_file_by_path(tmp_path):
    """The trial's own clorch-train was given the file's path; Hydra recorded the name it was registered by."""
    recipe = tmp_path / "recipes" / "tiny.yaml"
    recipe.parent.mkdir()
    recipe.write_text("# @package _global_\n")
    sweep = tmp_path / "multirun" / "s"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("{}\n")
    argv = ["clorch-train", f"+recipe={recipe}", "seed=2", "hydra.run.dir=multirun/s/1"]
    path = _run_dir(
        tmp_path,
        "multirun/s/1",
        summary={"status": "succeeded"},
        overrides=["+recipe=file_tiny", "++seed=2"],
        env={"cwd": str(tmp_path), "argv": argv},
    )
    assert rerun_command(Run(path)) == f"cd {tmp_path} && clorch-train +recipe={recipe} seed=2"
