"""`clorch-bench runner`: argument errors, and tiny smoke runs of both loops on gloo ranks."""

from __future__ import annotations

import pytest

from clorch.bench import runner


def test_every_bad_argument_is_reported_at_once(capsys):
    with pytest.raises(SystemExit) as exc:
        runner.main(["--device", "cpu", "--batch-size", "0", "--rounds", "0", "--peak-tflops", "-1", "--nproc", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--batch-size must be >= 1, got 0" in err and "--rounds must be >= 1, got 0" in err
    assert "--peak-tflops must be > 0, got -1.0" in err and "--nproc must be >= 1, got 0" in err


@pytest.mark.timeout(150)
def test_tiny_run_on_cpu_reports_both_loops(capsys):
    code = runner.main(
        [
            "--device",
            "cpu",
            "--preset",
            "tiny",
            "--batch-size",
            "2",
            "--rounds",
            "2",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--log-every",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert " plain | " in out and " clorch | " in out
    ratio = float(out.split("ratio clorch/plain tokens/s:")[1].split()[0])
    assert ratio > 0
    assert "GPU clock" not in out and "GPU during" not in out  # nothing to sample on CPU


@pytest.mark.timeout(150)
def test_the_dataset_path_runs_both_loops_through_a_dataloader_on_two_ranks(capsys):
    code = runner.main(
        [
            "--device",
            "cpu",
            "--preset",
            "tiny",
            "--batch-size",
            "2",
            "--rounds",
            "2",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--data",
            "dataset",
            "--num-workers",
            "1",
            "--nproc",
            "2",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "data=dataset (1 workers), cpu x 2;" in out and " clorch | " in out
    assert float(out.split("ratio clorch/plain tokens/s:")[1].split()[0]) > 0
