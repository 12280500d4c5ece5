"""`clorch-runs` over real run directories: a run, a 2-trial sweep, a failed run and a killed one.

The runs are made once for the module (clorch-train, clorch.run_local with a
failing rank, and a clorch-train whose process group gets SIGKILL mid-run).
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clorch.launch.procs import pid_alive
from clorch.runs.cli import run_cli
from clorch.runs.records import Run
from tests.clirunner import run_clorch_train
from tests.engine.faulty_worker import run_failing

pytestmark = pytest.mark.timeout(300)
TRAIN = Path(sys.executable).with_name("clorch-train")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _killed_run(cwd: Path) -> tuple[Path, str]:
    """Start clorch-train, note the status a listing gives while it runs, then SIGKILL its group."""
    proc = subprocess.Popen(
        [str(TRAIN), "+recipe=cpu_smoke", "epochs=200"],
        cwd=cwd,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not (records := list(cwd.glob("outputs/*/*/logs/job.json"))):
            assert proc.poll() is None and time.monotonic() < deadline, "clorch-train never launched"
            time.sleep(0.1)
        run_dir = records[0].parent.parent
        while_running = Run(run_dir).status
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    # The ranks lead sessions of their own; they die with the launcher (PDEATHSIG): wait for that.
    ranks = json.loads(records[0].read_text())["status"].get("pids") or []
    deadline = time.monotonic() + 30
    while any(pid_alive(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(pid) for pid in ranks)
    return run_dir, while_running


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A directory with outputs/ and multirun/ as clorch-train leaves them; {name: run dir}."""
    cwd = tmp_path_factory.mktemp("project")
    killed, while_running = _killed_run(cwd)
    done = run_clorch_train(["+recipe=cpu_smoke"], cwd, timeout=200)
    assert done.returncode == 0, done.stderr
    sweep = run_clorch_train(["-m", "+recipe=cpu_smoke", "optim.lr=1e-3,3e-3"], cwd, timeout=200)
    assert sweep.returncode == 0, sweep.stderr
    failed = cwd / "outputs" / "failed-run"
    with pytest.MonkeyPatch.context() as monkeypatch:
        result = run_failing(failed, 2, monkeypatch, recipe="cpu_smoke")
    assert result["summary"]["status"] == "failed"
    single = [p for p in cwd.glob("outputs/*/*") if p.is_dir() and p != killed and p.parent != failed]
    sweep_dir = next(cwd.glob("multirun/*/*"))
    return {
        "cwd": cwd,
        "killed": killed,
        "while_running": while_running,
        "single": single[0],
        "sweep": sweep_dir,
        "trial0": sweep_dir / "0",
        "trial1": sweep_dir / "1",
        "failed": failed,
    }


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = run_cli(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _ls_json(capsys, cwd: Path, *args: str) -> list[dict]:
    code, out, err = _cli(
        capsys, "ls", "--root", str(cwd / "outputs"), "--root", str(cwd / "multirun"), "--json", *args
    )
    assert code == 0, err
    return json.loads(out)


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*") if p.is_file()}


def test_ls_lists_every_run_with_what_its_files_tell(project, capsys):
    rows = {Path(r["dir"]): r for r in _ls_json(capsys, project["cwd"])}
    assert set(rows) == {project[k].resolve() for k in ("single", "trial0", "trial1", "failed", "killed")}
    assert project["while_running"] == "running"
    assert {k: rows[project[k].resolve()]["status"] for k in ("single", "trial0", "failed", "killed")} == {
        "single": "succeeded",
        "trial0": "succeeded",
        "failed": "failed",
        "killed": "killed",
    }
    trial = rows[project["trial0"].resolve()]
    assert trial["recipe"] == "cpu_smoke" and trial["overrides"] == ["optim.lr=0.001"]
    assert trial["sweep"] == str(project["sweep"].resolve()) and trial["world_size"] == 2
    assert trial["steps"] == trial["planned_steps"] == 4 and trial["final"]["eval_loss"] > 0
    assert trial["best"]["eval_loss"] == trial["final"]["eval_loss"]
    assert rows[project["failed"].resolve()]["steps"] == 2
    ids = [r["id"] for r in rows.values()]
    assert len(set(ids)) == 5 and all(len(i) == 8 for i in ids)


def test_ls_table_from_the_project_directory_imports_no_torch(project):
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "clorch.runs", "ls"],
        cwd=project["cwd"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "torch" not in out.stderr  # -X importtime lists every module imported
    lines = out.stdout.splitlines()
    assert lines[0].split()[:7] == ["id", "dir", "start", "recipe", "overrides", "status", "steps"]
    sweep_line = next(i for i, line in enumerate(lines) if " sweep" in line)
    assert "2 trial(s)" in lines[sweep_line]
    assert [("optim.lr=0.001" in lines[sweep_line + 1]), ("optim.lr=0.003" in lines[sweep_line + 2])] == [True] * 2
    assert sum(" killed " in line for line in lines) == 1 and sum(" failed " in line for line in lines) == 1


def test_ls_filters_and_sorts(project, capsys):
    cwd = project["cwd"]
    only = _ls_json(capsys, cwd, "--where", "optim.lr<0.002", "--where", "status==succeeded")
    assert [r["dir"] for r in only] == [str(project["trial0"].resolve())]
    bad = _ls_json(capsys, cwd, "--status", "failed,killed")
    assert sorted(r["status"] for r in bad) == ["failed", "killed"]
    assert _ls_json(capsys, cwd, "--since", "2999-01-01") == []
    by_recipe = {r["dir"] for r in _ls_json(capsys, cwd, "--recipe", "cpu_smoke")}
    assert len(by_recipe) == 4 and str(project["failed"].resolve()) not in by_recipe  # run_local names none
    ranked = _ls_json(capsys, cwd, "--sort", "eval_loss", "--where", "eval_loss>0")
    losses = [r["final"]["eval_loss"] for r in ranked]
    assert losses == sorted(losses) and len(losses) == 3
    code, out, err = _cli(capsys, "ls", "--root", str(cwd / "multirun"), "--csv")
    table = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and [r["overrides"] for r in table] == ["optim.lr=0.001", "optim.lr=0.003"]
    assert float(table[0]["final.eval_loss"]) > 0 and table[0]["status"] == "succeeded"


@pytest.mark.parametrize(
    "args, named",
    [
        (["ls", "--where", "eval_loss<<0.1"], "--where 'eval_loss<<0.1': expected KEY OP VALUE"),
        (["ls", "--where", "evl_loss<0.1"], "unknown key 'evl_loss'"),
        (["ls", "--status", "crashed"], "--status 'crashed': not a run status; allowed: succeeded"),
        (["ls", "--since", "yesterday"], "--since 'yesterday'"),
        (["ls", "--sort", "nope"], "--sort 'nope': unknown key"),
        (["show", "feedbeef"], "RUN 'feedbeef': no run has that directory or id"),
        (["diff", "failed-run", "nope/7"], "RUN 'nope/7'"),
    ],
)
def test_bad_arguments_exit_2_naming_them(project, capsys, monkeypatch, args, named):
    monkeypatch.chdir(project["cwd"])
    code, out, err = _cli(capsys, *args)
    assert code == 2 and named in err and out == ""


def test_a_missing_root_and_a_sweep_named_as_a_run_exit_2(project, capsys):
    code, _, err = _cli(capsys, "ls", "--root", str(project["cwd"] / "nowhere"))
    assert code == 2 and "--root" in err and "not a directory" in err
    code, _, err = _cli(capsys, "show", str(project["sweep"]))
    assert code == 2 and "is a sweep directory" in err and str(project["trial1"]) in err


def test_show_gives_config_status_and_the_command_that_reruns_it(project, capsys, monkeypatch):
    monkeypatch.chdir(project["cwd"])
    trial = Run(project["trial0"])
    code, out, err = _cli(capsys, "show", trial.id[:5])
    assert code == 0, err
    assert f"re-run: cd {project['cwd']} && clorch-train +recipe=cpu_smoke optim.lr=0.001" in out
    assert "status     succeeded" in out and "lr: 0.001" in out and "eval_loss" in out
    code, out, _ = _cli(capsys, "show", "failed-run", "--json")
    shown = json.loads(out)
    assert (
        shown["status"] == "failed" and shown["error"]["rank"] == 1 and "exited with code" in shown["error"]["message"]
    )
    assert shown["commands"]["rerun"].startswith("not known: the run was not started by clorch-train")
    code, out, _ = _cli(capsys, "show", str(project["killed"]), "--json")
    assert json.loads(out)["status"] == "killed" and json.loads(out)["config"]["epochs"] == 200


def test_diff_names_the_keys_that_differ_and_the_metrics(project, capsys, monkeypatch):
    monkeypatch.chdir(project["cwd"])
    a, b = Run(project["trial0"]), Run(project["trial1"])
    code, out, _ = _cli(capsys, "diff", a.id, f"{project['sweep'].name}/1", "--json")
    data = json.loads(out)
    assert code == 0 and data["config"] == {"optim.lr": [0.001, 0.003]}
    assert data["metrics"]["final.eval_loss"] == [a.final["eval_loss"], b.final["eval_loss"]]
    code, out, _ = _cli(capsys, "diff", a.id, b.id)
    assert "config keys that differ" in out and "optim.lr" in out and "final.eval_loss" in out


def test_plot_draws_the_runs_labelled_by_what_differs(project, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    before = _tree(project["cwd"])
    code, out, err = _cli(
        capsys,
        "plot",
        str(project["trial0"]),
        str(project["trial1"]),
        "--metric",
        "eval_loss",
        "--out",
        str(tmp_path / "curves.png"),
    )
    assert code == 0, err
    assert (tmp_path / "curves.png").read_bytes().startswith(PNG_SIGNATURE)
    from clorch.runs.plot import labels

    assert labels([Run(project["trial0"]), Run(project["trial1"])]) == ["optim.lr=0.001", "optim.lr=0.003"]
    code, _, err = _cli(capsys, "plot", str(project["trial0"]), "--out", str(project["trial0"] / "x.png"))
    assert code == 2 and "never writes into run directories" in err
    assert _tree(project["cwd"]) == before


def test_plot_without_matplotlib_says_which_extra_brings_it(project, tmp_path):
    blocked = (
        "import sys; sys.modules['matplotlib'] = None; from clorch.runs.cli import run_cli; "
        f"sys.exit(run_cli(['plot', {str(project['trial0'])!r}, '--out', {str(tmp_path / 'p.png')!r}]))"
    )
    out = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "pip install 'clorch[plot]'" in out.stderr
    assert not (tmp_path / "p.png").exists()


def test_listing_and_showing_write_nothing_into_run_directories(project, capsys, monkeypatch):
    monkeypatch.chdir(project["cwd"])
    before = _tree(project["cwd"])
    for args in (
        ["ls"],
        ["ls", "--csv"],
        ["show", "failed-run"],
        ["show", str(project["killed"])],
        ["diff", str(project["single"]), str(project["killed"])],
    ):
        assert _cli(capsys, *args)[0] == 0
    assert _tree(project["cwd"]) == before


def test_a_continued_trials_legend_names_what_it_trained_not_where_it_resumed(tmp_path):
    # A sweep's cut-off trial runs again with checkpoint.resume=latest: the same training.
    import yaml

    from clorch.runs.plot import labels

    runs = []
    for name, lr, resume in (("a", 0.001, "none"), ("b", 0.003, "latest")):
        run = tmp_path / name
        run.mkdir()
        config = {"optim": {"lr": lr}, "checkpoint": {"resume": resume, "dir": str(run / "checkpoints")}}
        (run / "config.yaml").write_text(yaml.safe_dump(config))
        runs.append(Run(run))
    assert labels(runs) == ["optim.lr=0.001", "optim.lr=0.003"]
