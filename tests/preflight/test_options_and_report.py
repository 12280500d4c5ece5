"""In-process: the options' checks, the verdict's lines and table, and a preflight outside a group."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from clorch.preflight import PreflightConfig, normalize_mode
from clorch.preflight.report import verdict, where

pytestmark = pytest.mark.timeout(60)


def test_defaults_are_valid_and_modes_normalize():
    cfg = PreflightConfig().validate()
    assert cfg.run_mode == "false" and cfg.slow_ratio == 0.7 and cfg.timeout_s == 30.0
    assert cfg.sizes_mb(on_gpu=False) == [1, 4] and cfg.sizes_mb(on_gpu=True) == [1, 16, 64, 256]
    assert cfg.gemm_size(on_gpu=False) == 512 and cfg.gemm_size(on_gpu=True) == 8192
    assert [normalize_mode(m) for m in (True, False, "only", " TRUE ")] == ["true", "false", "only", "true"]


def test_every_bad_value_is_reported_at_once():
    cfg = PreflightConfig(
        mode="maybe",
        slow_ratio=1.5,
        timeout_s=0,
        allreduce_sizes_mb=[1, -4],
        allreduce_iters=0,
        matmul_size=2.5,
        matmul_repeats=True,
        disk_check="some",
        disk_write_mb=-1,
        p2p_mb="1",
    )
    with pytest.raises(ValueError) as info:
        cfg.validate()
    lines = str(info.value).splitlines()
    assert lines == [
        "preflight.mode must be one of auto, false, true, only (or a bool), got 'maybe'",
        "preflight.slow_ratio must be a fraction in [0, 1) (0 turns the comparison off), got 1.5",
        "preflight.timeout_s must be > 0 (seconds), got 0",
        "preflight.allreduce_iters must be an int > 0 (timed all-reduces per size), got 0",
        "preflight.matmul_repeats must be an int > 0 (timed GEMMs), got True",
        "preflight.disk_write_mb must be an int > 0 (MiB), got -1",
        "preflight.p2p_mb must be an int > 0 (MiB), got '1'",
        "preflight.matmul_size must be an int > 0 (n of the n x n GEMM) or null for the device's default, got 2.5",
        "preflight.allreduce_sizes_mb must be a non-empty list of positive ints (MiB) or null for the "
        "device's default, got [1, -4]",
        "preflight.disk_check must be one of host_leaders, all, none, got 'some'",
    ]


def test_the_options_module_does_not_import_torch():
    code = (
        "import sys; from clorch.preflight import PreflightConfig; PreflightConfig().validate(); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _row(rank, host, tflops, torch_version="2.14.1"):
    return {
        "rank": rank,
        "host": host,
        "local_rank": rank % 4,
        "local_world_size": 4,
        "device": "cuda:0 H200",
        "device_uuid": f"GPU-{rank}",
        "failures": [],
        "tflops": tflops,
        "disk_mb_s": None,
        "versions": {"torch": torch_version, "cuda": "13.0", "cudnn": "92400", "nccl": "2.27.7", "clorch": "0.1.0"},
    }


def test_the_verdict_names_a_slow_rank_a_version_and_a_shared_device():
    rows = {r: _row(r, "a" if r < 4 else "b", 347.0) for r in range(8)}
    rows[3]["tflops"] = 212.0
    rows[5]["versions"]["torch"] = "2.11.0"
    rows[6]["device_uuid"] = rows[7]["device_uuid"]
    result = verdict(rows, {}, 8, 0.8, {}, {}, 1.0)
    assert result.failures == [
        "rank 5 on host b: torch 2.11.0, while ranks 0, 1, 2, 3, 4, 6, 7 have 2.14.1",
        "ranks 6, 7 on host b share CUDA device GPU-7 (cuda:0 H200): each rank needs its own "
        "(CUDA_VISIBLE_DEVICES per rank, or fewer ranks per node)",
        "rank 3 on host a: matmul 212 TFLOP/s, 0.61 of the median 347",
    ]
    assert not result.passed
    status = {line.split()[0]: line.split()[-1] for line in result.table.splitlines()[1:]}
    assert status == {"0": "ok", "1": "ok", "2": "ok", "3": "FAIL", "4": "ok", "5": "FAIL", "6": "FAIL", "7": "FAIL"}
    assert json.loads(json.dumps(result.to_dict()))["failures"] == result.failures


def test_ranks_are_compared_within_their_host_and_hosts_by_their_medians():
    rows = {r: _row(r, "a" if r < 4 else "b", 100.0) for r in range(8)}
    for r in range(4, 8):
        rows[r]["tflops"] = 30.0  # a whole node slow: named once, as the host, with its ranks
    rows[0]["disk_mb_s"], rows[4]["disk_mb_s"] = 500.0, 200.0  # the hosts' leaders time the disk
    result = verdict(rows, {}, 8, 0.8, {}, {}, 1.0, disk_slow_ratio=0.25)
    assert result.failures == [
        "host b (ranks 4, 5, 6, 7): matmul 30 TFLOP/s (median), 0.46 of the median 65 of the 2 hosts"
    ]
    status = [line.split()[-1] for line in result.table.splitlines()[1:]]
    assert status == ["ok"] * 4 + ["FAIL"] * 4
    # A disk is judged by its own, looser ratio: 0.57 of the median passes, 0.18 fails.
    for r in range(4, 8):
        rows[r]["tflops"] = 100.0
    rows[4]["disk_mb_s"] = 50.0
    assert verdict(rows, {}, 8, 0.8, {}, {}, 1.0, disk_slow_ratio=0.25).failures == [
        "rank 4 on host b: checkpoint write 50 MB/s, 0.18 of the median 275 of the 2 hosts"
    ]
    assert verdict(rows, {}, 8, 0.8, {}, {}, 1.0, disk_slow_ratio=0.0).passed


def test_the_spread_of_healthy_cpu_ranks_passes_and_a_quarter_speed_rank_fails():
    # One core's GEMM speed in CPU time, as measured on a loaded 2-core machine (TFLOP/s,
    # docs/scale-out.md): ranks paired on one host, the closest and the farthest apart seen.
    rows = {r: {**_row(r, "vm", 0.0), "device_uuid": None} for r in range(2)}
    ratio = PreflightConfig().slow_ratio
    for low, high in ((0.0765, 0.0798), (0.0856, 0.1029), (0.0649, 0.0909), (0.0632, 0.0843)):
        rows[0]["tflops"], rows[1]["tflops"] = low, high
        assert verdict(rows, {}, 2, ratio, {}, {}, 1.0).passed
    rows[0]["tflops"], rows[1]["tflops"] = 0.1 / 4, 0.1  # 4x the work per multiply
    assert verdict(rows, {}, 2, ratio, {}, {}, 1.0).failures == [
        "rank 0 on host vm: matmul 0.025 TFLOP/s, 0.40 of the median 0.0625"
    ]


def test_a_silent_rank_is_placed_on_its_node_by_the_launch_layout():
    known = {
        0: {"rank": 0, "host": "a", "local_rank": 0, "local_world_size": 4},
        5: {"rank": 5, "host": "b", "local_rank": 1, "local_world_size": 4},
    }
    assert where(0, known) == "rank 0 on host a"
    assert where(6, known) == "rank 6 (on host b, by the launch layout)"
    assert where(9, known) == "rank 9 (host unknown)"


def test_outside_a_group_the_preflight_checks_this_process(tmp_path):
    from clorch.preflight import format_report, run_preflight

    result = run_preflight({"timeout_s": 5}, run_dir=tmp_path, checkpoint_dir=tmp_path / "ckpt", model_params=10)
    assert result.passed, result.failures
    assert [row["rank"] for row in result.ranks] == [0]
    assert result.ranks[0]["busbw_gb_s"] is None and result.ranks[0]["disk_mb_s"] > 0
    assert json.loads((tmp_path / "preflight.json").read_text())["passed"] is True
    assert format_report(result).endswith("preflight PASSED")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["preflight.json"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"model_params": -1}, "model_params must be a number >= 0, got -1"),
        ({"model_params": 1.5}, "model_params must be a number >= 0, got 1.5"),
        ({"model_params": 10, "bytes_per_param": "4"}, "bytes_per_param must be a number >= 0, got '4'"),
        ({"model_params": 10, "options": {"slow_ratio": 2}}, "preflight.slow_ratio must be a fraction"),
        ({"model_params": 10, "group": object()}, "group must be None or the default group"),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(tmp_path, kwargs, message):
    from clorch.preflight import run_preflight

    options = kwargs.pop("options", {})
    with pytest.raises(ValueError) as info:
        run_preflight(options, run_dir=tmp_path, checkpoint_dir=None, **kwargs)
    assert message in str(info.value)
    assert list(tmp_path.iterdir()) == []
