"""The nvidia-smi sampler behind the MFU benchmarks: parsing, summaries, and a CPU device."""

from __future__ import annotations

import os
import shutil
import time

import pytest
import torch

from clorch.bench.gpuclock import GpuMonitor, describe, parse_line, summarize


def test_a_full_line_parses_and_partial_lines_do_not():
    sample = parse_line("1650, 1980, 682.67, 700.00, Active, 55")
    assert sample is not None
    assert (sample.sm_mhz, sample.max_sm_mhz, sample.power_w, sample.power_limit_w) == (1650, 1980, 682.67, 700)
    assert sample.power_capped and sample.temperature_c == 55
    assert not parse_line("1845, 1980, 232.8, 700.00, Not Active, 49").power_capped
    assert parse_line("[N/A], 1980, 232.8, 700.00, Not Active, 49") is None
    assert parse_line("1845, 1980") is None
    assert parse_line("") is None


def test_summary_takes_medians_ranges_and_the_capped_share():
    lines = [
        "1845, 1980, 232.8, 700, Not Active, 49",
        "1700, 1980, 690, 700, Active, 56",
        "1650, 1980, 680, 700, Active, 57",
    ]
    summary = summarize([parse_line(line) for line in lines])
    assert summary["samples"] == 3 and summary["sm_mhz"] == 1700
    assert (summary["sm_mhz_min"], summary["sm_mhz_max"], summary["max_sm_mhz"]) == (1650, 1845, 1980)
    assert summary["power_w"] == 680 and summary["power_capped"] == 2 / 3
    assert summary["temperature_c_max"] == 57
    text = describe(summary)
    assert "1700 MHz (1650-1845" in text and "67% of samples" in text
    assert summarize([]) is None and "not sampled" in describe(None)


def test_a_cpu_device_samples_nothing():
    with GpuMonitor(torch.device("cpu")) as monitor:
        torch.ones(4).sum()
    assert monitor.summary() is None


@pytest.mark.cuda
@pytest.mark.timeout(60)
def test_a_gpu_is_sampled_while_it_works():
    if shutil.which("nvidia-smi") is None:
        pytest.skip("needs nvidia-smi")
    device = torch.device("cuda", 0)
    x = torch.randn(4096, 4096, device=device)
    with GpuMonitor(device, interval_ms=100) as monitor:
        deadline = time.monotonic() + 4  # nvidia-smi may take a second to start
        while time.monotonic() < deadline:
            x = (x @ x).tanh_()
        torch.cuda.synchronize()
    summary = monitor.summary()
    assert summary is not None and summary["samples"] >= 3, summary
    assert 0 < summary["sm_mhz"] <= summary["max_sm_mhz"]


def _fake_smi(tmp_path, monkeypatch, body: str) -> None:
    """An `nvidia-smi` on PATH that runs `body` (a shell script), for a monitor of a pretend GPU."""
    from clorch.bench import gpuclock

    script = tmp_path / "nvidia-smi"
    script.write_text(body)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(gpuclock, "_device_id", lambda device: "GPU-pretend")


READINGS = """#!/bin/sh
{trap}
i=0
while [ $i -lt 6000 ]; do echo "1700, 1980, 690.5, 700.00, Active, 55"; i=$((i+1)); done
while true; do sleep 0.05; done
"""


@pytest.mark.timeout(60)
def test_every_reading_is_kept_past_a_pipes_capacity(tmp_path, monkeypatch):
    _fake_smi(tmp_path, monkeypatch, READINGS.format(trap=""))  # about 230 KB of readings
    with GpuMonitor(torch.device("cpu"), interval_ms=100) as monitor:
        time.sleep(1.0)
    summary = monitor.summary()
    assert summary is not None and summary["samples"] == 6000 and monitor.problem is None
    assert summary["sm_mhz"] == 1700 and summary["power_capped"] == 1.0


@pytest.mark.timeout(60)
def test_a_sampler_that_ignores_sigterm_is_killed(tmp_path, monkeypatch):
    _fake_smi(tmp_path, monkeypatch, READINGS.format(trap="trap '' TERM"))
    start = time.monotonic()
    with GpuMonitor(torch.device("cpu"), interval_ms=100) as monitor:
        time.sleep(0.5)
    assert time.monotonic() - start < 20
    assert monitor.summary()["samples"] == 6000


@pytest.mark.timeout(60)
def test_a_failing_or_broken_sampler_is_named_and_raises_nothing(tmp_path, monkeypatch):
    _fake_smi(tmp_path, monkeypatch, "#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    with GpuMonitor(torch.device("cpu"), interval_ms=100) as monitor:
        time.sleep(0.3)
    assert monitor.summary() is None
    assert "exit status 6" in monitor.problem and "No devices were found" in monitor.problem
    assert describe(None, monitor.problem).startswith("GPU clock: not sampled (nvidia-smi gave no readings")
    _fake_smi(tmp_path, monkeypatch, "#!/nonexistent/interpreter\n")
    with GpuMonitor(torch.device("cpu"), interval_ms=100) as monitor:
        pass
    assert monitor.summary() is None and monitor.problem.startswith("nvidia-smi did not start")
