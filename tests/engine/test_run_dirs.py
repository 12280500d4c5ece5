"""Each `clorch-train` run writes into a directory of its own, also when runs start together."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import threading
from pathlib import Path

import pytest
import yaml

from clorch.engine import outputs
from clorch.engine.outputs import new_run_dir
from tests.clirunner import CliProcess, start_clorch_train

DONE = re.compile(r"clorch-train: succeeded, \d+ steps, loss (\S+), .*; outputs in (.+)$", re.M)


def _start(args: list[str], cwd: Path) -> CliProcess:
    return start_clorch_train(args, cwd, env={**os.environ, "PYTHONWARNINGS": "ignore"})


def _taken_seconds(cwd: Path, seconds: int) -> list[Path]:
    """Occupy outputs/DATE/TIME for the coming seconds, so that every run collides."""
    now = dt.datetime.now()
    taken = []
    for s in range(seconds):
        t = now + dt.timedelta(seconds=s)
        path = cwd / "outputs" / t.strftime("%Y-%m-%d") / t.strftime("%H-%M-%S")
        path.mkdir(parents=True, exist_ok=True)
        taken.append(path)
    return taken


@pytest.mark.timeout(240)
def test_concurrent_runs_get_their_own_directories_and_outputs(tmp_path):
    taken = _taken_seconds(tmp_path, 180)
    seeds = (1, 2)  # two runs starting in the same taken seconds: each must find its own directory
    procs = {seed: _start(["+recipe=cpu_smoke", "max_steps=2", f"seed={seed}"], tmp_path) for seed in seeds}
    finished = {seed: proc.communicate(timeout=200) for seed, proc in procs.items()}
    losses, dirs = {}, {}
    for seed, (out, err) in finished.items():
        assert procs[seed].returncode == 0, err
        shown_loss, run_dir = DONE.search(out).groups()
        run_dir = Path(run_dir)
        assert re.fullmatch(r"\d\d-\d\d-\d\d-\d+", run_dir.name), run_dir  # collided: a suffix
        assert yaml.safe_load((run_dir / "config.yaml").read_text())["seed"] == seed
        assert f"seed={seed}" in (run_dir / ".hydra" / "overrides.yaml").read_text()
        summary = json.loads((run_dir / "summary.json").read_text())
        last = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"train"' in line][
            -1
        ]
        assert summary["status"] == "succeeded" and summary["final"]["loss"] == last["loss"]
        assert f"{summary['final']['loss']:.4g}" == shown_loss  # what this process reported
        assert (run_dir / "logs" / "rank_0.stdout").is_file()
        losses[seed], dirs[seed] = summary["final"]["loss"], run_dir
    assert len(set(dirs.values())) == 2
    assert losses[1] != losses[2]
    assert all(not any(path.iterdir()) for path in taken)  # nobody wrote into a taken directory


def test_new_run_dir_is_atomic_and_numbers_collisions(tmp_path, monkeypatch):
    fixed = dt.datetime(2026, 1, 2, 3, 4, 5)
    monkeypatch.setattr(outputs._dt, "datetime", type("Frozen", (), {"now": staticmethod(lambda: fixed)}))
    made: list[Path] = []
    threads = [threading.Thread(target=lambda: made.append(new_run_dir(tmp_path))) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(p.name for p in made) == ["03-04-05", *(f"03-04-05-{n}" for n in range(1, 6))]
    assert {p.parent for p in made} == {tmp_path / "outputs" / "2026-01-02"}
    assert new_run_dir(tmp_path, layout="multirun") == tmp_path / "multirun" / "2026-01-02" / "03-04-05"


@pytest.mark.timeout(120)
def test_chosen_run_dir_is_kept_and_no_empty_log_file(tmp_path):
    proc = _start(["+recipe=cpu_smoke", "max_steps=2", "hydra.run.dir=mine"], tmp_path)
    out, err = proc.communicate(timeout=100)
    assert proc.returncode == 0, err
    assert f"outputs in {tmp_path / 'mine'}" in out
    assert (tmp_path / "mine" / "summary.json").is_file()
    assert not (tmp_path / "outputs").exists()
    assert not (tmp_path / "mine" / "clorch-train.log").exists()  # nothing was logged
