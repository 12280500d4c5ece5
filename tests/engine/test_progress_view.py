"""What the progress view shows of each metrics record: every eval metric, your own included,
and nothing that is not a number."""

from __future__ import annotations

import io
import json

import pytest

from clorch.engine.progress import Progress
from clorch.engine.summary import shown_metrics

pytestmark = pytest.mark.timeout(60)
EVAL = {
    "kind": "eval",
    "step": 4,
    "epoch": 0,
    "eval_loss": 0.5,
    "eval_accuracy": 0.875,
    "eval_perplexity": 12.25,
    "eval_note": "text",
    "eval_flag": True,
    "time_s": 0.01,
}


def _shown(tmp_path, mode: str) -> str:
    path = tmp_path / "metrics.jsonl"
    stream = io.StringIO()
    progress = Progress(path, total_steps=8, mode=mode, stream=stream)
    path.write_text(
        json.dumps({"kind": "train", "step": 4, "loss": 0.75, "grad_norm": 1.5, "lr": 0.001, "samples_per_s": 100.0})
        + "\n"
        + json.dumps(EVAL)
        + "\n"
    )
    progress.close()
    return stream.getvalue()


def test_every_eval_metric_reaches_the_console_as_a_line(tmp_path):
    assert _shown(tmp_path, "lines").splitlines() == [
        "step 4/8  loss 0.75  grad_norm 1.5  lr 0.001  samples_per_s 100",
        "step 4/8  eval_loss 0.5  eval_accuracy 0.875  eval_perplexity 12.25",
    ]


def test_every_eval_metric_reaches_the_bar(tmp_path):
    shown = _shown(tmp_path, "bar")
    for part in ("eval_loss=0.5", "eval_accuracy=0.875", "eval_perplexity=12.25"):
        assert part in shown
    assert "eval_note" not in shown and "eval_flag" not in shown


def test_the_final_line_shows_the_loss_and_every_eval_metric():
    final = {
        "loss": 0.25,
        "eval_loss": 0.5,
        "eval_accuracy": 0.875,
        "eval_flag": True,
        "lr": 0.001,
        "eval_note": "text",
    }
    assert shown_metrics(final) == "loss 0.25, eval_loss 0.5, eval_accuracy 0.875"
