"""What a run leaves beside its metrics: loss.png with the eval metrics, without matplotlib's
log lines on the console; env.json's command line as the user typed it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clorch.engine.outputs import env_record, typed_command

ROOT = Path(__file__).resolve().parents[2]


def _metrics(run_dir: Path) -> None:
    records = [{"kind": "train", "step": s, "loss": 2.0 / s} for s in range(1, 9)]
    records += [{"kind": "eval", "step": s, "eval_loss": 1.5 / s, "eval_exact": s / 10, "time_s": 0.1} for s in (4, 8)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_loss_png_has_a_panel_for_the_eval_metrics_and_matplotlib_stays_quiet(tmp_path):
    pytest.importorskip("matplotlib", reason="needs the plot extra")
    _metrics(tmp_path)
    # A fresh interpreter and font cache: matplotlib's first use logs "generated new fontManager"
    # at INFO, which a console handler at INFO (Hydra's) would show.
    code = (
        "import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stderr)\n"
        "from pathlib import Path\nfrom clorch.engine.outputs import plot_loss\n"
        f"print(plot_loss(Path({str(tmp_path)!r})))\n"
        "logging.getLogger('matplotlib').info('level restored')\n"
    )
    env = {
        **os.environ,
        "MPLCONFIGDIR": str(tmp_path / "mplconfig"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "loss.png")
    assert done.stderr.strip() == "INFO:matplotlib:level restored"
    from PIL import Image

    with Image.open(tmp_path / "loss.png") as image:
        assert image.size == (600, 800)  # two panels: the losses, then eval_exact


def test_loss_png_without_other_eval_metrics_is_one_panel(tmp_path):
    pytest.importorskip("matplotlib", reason="needs the plot extra")
    from PIL import Image

    from clorch.engine.outputs import plot_loss

    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"kind": "train", "step": 1, "loss": 1.0})
        + "\n"
        + json.dumps({"kind": "eval", "step": 1, "eval_loss": 0.9, "time_s": 0.1})
        + "\n"
    )
    with Image.open(plot_loss(tmp_path)) as image:
        assert image.size == (600, 400)


def test_env_record_keeps_the_command_line_as_typed():
    typed = ["clorch-train", "+recipe=./my recipe.yaml", "optim.lr=3e-4", "--multirun"]
    with typed_command(typed):
        with typed_command(["inner"]):
            assert env_record()["command"] == ["inner"]
        assert env_record()["command"] == typed
        assert env_record(["given"])["command"] == ["given"]
    assert env_record()["command"] == sys.argv
