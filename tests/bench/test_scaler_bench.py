"""`clorch-bench scaler`: both scalers really run on the chosen device (no scaler disabled on CPU)."""

from __future__ import annotations

import warnings

import pytest

from clorch.bench import scaler


@pytest.mark.timeout(120)
def test_cpu_run_times_two_enabled_scalers(capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "the scaler is disabled" on a CPU-only machine
        code = scaler.main(["--device", "cpu", "--layers", "1", "--width", "64", "--rounds", "2", "--steps", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert " clorch | " in out and " torch | " in out
