"""A run's history is whole: a run resumed from another run's checkpoint starts its
metrics.jsonl with that run's records up to the resumed step (not after it), names
the run it continues, and the console does not show the carried records again."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from clorch.train.metrics import EVENTS, MetricsWriter, read_metrics, resumed_history, without_timing
from clorch.engine.progress import Progress
from tests.engine.resume_story import run

pytestmark = pytest.mark.timeout(240)

# The runs are tests.engine.resume_story's (shared with tests/engine/test_reproducible.py): 16 steps,
# checkpoints every 3 steps, so a kill after step 10 resumes from step 9, and step 10's records are
# trained again.


def _train(i: int, step: int, kind: str = "train") -> dict:
    if kind == "eval":
        return {"kind": "eval", "step": step, "eval_loss": 1.0 / step, "time_s": 0.1 * i}
    return {"kind": "train", "step": step, "loss": 2.0 / step, "samples_per_s": 100.0 + i}


def test_resumed_history_keeps_the_records_up_to_the_step():
    records = [_train(0, 2), _train(0, 4), _train(0, 5, "eval"), _train(0, 6), _train(0, 8), _train(0, 8, "eval")]
    # Steps after the checkpoint are trained again; an evaluation at the step is not.
    assert resumed_history(records, 5, 8) == records[:3]
    assert resumed_history(records, 7, 8) == records[:4]
    # At the last step the resumed run evaluates again: that evaluation is its own.
    assert resumed_history(records, 8, 8) == records[:5]
    assert resumed_history([], 4, 8) == []


def test_metrics_writer_starts_with_the_history_and_replaces_the_old_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(_train(9, 2)) + "\n" + "{cut short")
    assert read_metrics(path, skip_damaged=True) == [_train(9, 2)]
    with pytest.raises(ValueError):
        read_metrics(path)
    writer = MetricsWriter(path, history=[_train(0, 2), _train(0, 4)])
    writer.write(_train(1, 6))
    writer.close()
    assert read_metrics(path) == [_train(0, 2), _train(0, 4), _train(1, 6)]
    MetricsWriter(path).close()  # a fresh start: an empty file
    assert read_metrics(path) == []


def test_progress_shows_the_announcement_instead_of_the_carried_records(tmp_path):
    path = tmp_path / "metrics.jsonl"
    stream = io.StringIO()
    progress = Progress(path, total_steps=8, mode="lines", stream=stream)
    # The order the worker writes them in: the announcement, then the file with the history.
    (tmp_path / EVENTS).write_text(json.dumps({"message": "resuming at step 4", "carried_records": 2}) + "\n")
    path.write_text("".join(json.dumps({"kind": "train", "step": s, "loss": 0.5}) + "\n" for s in (2, 4)))
    progress.poll()
    with open(path, "a") as f:
        f.write(json.dumps({"kind": "train", "step": 6, "loss": 0.25}) + "\n")
    progress.close()
    assert stream.getvalue().splitlines() == ["clorch: resuming at step 4", "step 6/8  loss 0.25"]


@pytest.fixture
def uninterrupted(resume_story):
    return resume_story.tmp, resume_story.uninterrupted()


def _metrics(run_dir) -> list[dict]:
    return without_timing(read_metrics(Path(run_dir) / "metrics.jsonl"))


def _events(run_dir) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / EVENTS).read_text().splitlines()]


def test_a_run_resumed_in_a_new_directory_holds_the_whole_history(uninterrupted, resume_story, tmp_path):
    tmp, whole = uninterrupted
    killed, killed_records = resume_story.killed()  # its records as it ended
    assert killed["status"]["state"] == "failed"
    assert max(r["step"] for r in killed_records) == 10  # step 10 was logged and evaluated, then lost
    resumed = resume_story.resumed()  # checkpoint.resume=latest in the killed run's checkpoint directory
    assert resumed["status"]["state"] == "succeeded", resumed["logs"]
    assert resumed["summary"]["resumed_from"].endswith("step_00000009.ckpt")
    # Every record once, as the uninterrupted run wrote them; the ones up to step 9 are the killed
    # run's, copied (timing fields included), and its own directory is left as it was.
    assert _metrics(tmp / "resumed") == _metrics(whole["run_dir"])
    carried = read_metrics(tmp / "resumed" / "metrics.jsonl")[:5]
    assert carried == [r for r in killed_records if r["step"] <= 9]
    assert read_metrics(tmp / "killed" / "metrics.jsonl") == killed_records
    assert resumed["summary"]["best"]["step"] == whole["summary"]["best"]["step"]
    assert resumed["status"]["results"][0]["resumed_run_dir"] == str(tmp / "killed")
    event = _events(tmp / "resumed")[-1]
    assert event["resumed_run_dir"] == str(tmp / "killed") and event["carried_records"] == 5
    assert "carried over from" in event["message"]

    # Resumed again from the end (the last checkpoint is the resumed run's): nothing is trained,
    # the history is the resumed run's, and the final evaluation is not there twice.
    again = run(tmp_path, "again", **{"checkpoint.dir": str(tmp / "ckpt_killed"), "checkpoint.resume": "latest"})
    assert again["status"]["state"] == "succeeded", again["logs"]
    assert again["summary"]["resumed_from"].endswith("step_00000016.ckpt")
    assert again["status"]["results"][0]["resumed_run_dir"] == str(tmp / "resumed")
    assert _metrics(tmp_path / "again") == _metrics(whole["run_dir"])


def test_a_restart_in_the_same_directory_names_no_earlier_run(uninterrupted, resume_story):
    tmp, whole = uninterrupted
    result = resume_story.restart()  # killed after step 10 under launcher.max_restarts=1
    assert result["status"]["state"] == "succeeded", result["logs"]
    assert _metrics(result["run_dir"]) == _metrics(whole["run_dir"])
    assert result["status"]["results"][0]["resumed_run_dir"] is None
    assert "resumed_run_dir" not in _events(result["run_dir"])[-1]
