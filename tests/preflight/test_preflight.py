"""The preflight on real gloo ranks: a clean job passes; a slow, mismatched, missing or hung rank
and a bad checkpoint directory fail with the rank and host named, within the preflight's timeouts.

Faults are injected from here, inside a rank (a wrapped timing or version function, a rank that
never calls or sleeps), never through the product.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.harness import run_ranks

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 3.0  # the preflight's own deadline in these tests: short, so a missing rank costs little


def _preflight(run_dir, checkpoint_dir, **options):
    from clorch.preflight import run_preflight

    options = {"timeout_s": TIMEOUT_S, **options}
    return run_preflight(options, run_dir=run_dir, checkpoint_dir=checkpoint_dir, model_params=250_000)


def _clean(rank: int, world_size: int, run_dir: str, ckpt: str) -> dict:
    from clorch.preflight import local

    # Two hosts, as two nodes would be: ranks 0 and 1 on node-a, rank 2 on node-b.
    local.hostname = lambda: "node-a" if rank < 2 else "node-b"
    # The default comparison, on cores shared by the 3 ranks and whatever else the machine runs.
    result = _preflight(run_dir, ckpt)
    return result.to_dict()


def test_a_clean_job_passes_and_writes_the_table_and_json(tmp_path):
    ckpt = tmp_path / "ckpt"
    results = run_ranks(_clean, 3, str(tmp_path), str(ckpt), timeout=90)
    for result in results:
        assert result["passed"], result["failures"]
        assert result["failures"] == []
    verdict = results[0]
    assert all(r == verdict for r in results[1:])  # every rank returns rank 0's verdict
    written = json.loads((tmp_path / "preflight.json").read_text())
    assert written == verdict
    rows = {row["rank"]: row for row in verdict["ranks"]}
    assert sorted(rows) == [0, 1, 2]
    assert [rows[r]["host"] for r in range(3)] == ["node-a", "node-a", "node-b"]
    for row in rows.values():
        assert row["tflops"] > 0 and row["p2p_ms"] > 0
        assert sorted(row["busbw_gb_s"]) == ["1", "4"]  # the CPU's default sizes, MiB (JSON keys)
        assert all(v > 0 for v in row["busbw_gb_s"].values())
    # The nodes' leading ranks (0 and 2) ran the inter-node all-reduce and timed the checkpoint write.
    assert [rows[r]["internode_busbw_gb_s"] is not None for r in range(3)] == [True, False, True]
    assert [rows[r]["disk_mb_s"] is not None for r in range(3)] == [True, False, True]
    lines = verdict["table"].splitlines()
    assert lines[0].split()[:3] == ["rank", "host", "device"] and "GEMM TFLOP/s" in lines[0]
    assert [line.split()[:2] for line in lines[1:]] == [["0", "node-a"], ["1", "node-a"], ["2", "node-b"]]
    assert all(line.rstrip().endswith("ok") for line in lines[1:])
    assert "250,000 params" in verdict["estimate"]["text"]
    # The timed write left nothing: no probe file, and the checkpoint directory was not created.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["preflight.json"]


def _slowed(rank: int, slow_rank: int) -> None:
    """On `slow_rank`, every multiply does its work 4 times: a rank at a quarter of its peers' speed."""
    import torch

    real = getattr(torch.matmul, "real", torch.matmul)

    def four_times(*args, **kwargs):
        for _ in range(3):
            real(*args, **kwargs)
        return real(*args, **kwargs)

    four_times.real = real
    torch.matmul = four_times if rank == slow_rank else real


def _slow(rank: int, world_size: int, run_dir: str) -> list[dict]:
    from clorch.preflight import local

    _slowed(rank, slow_rank=1)  # three ranks of this one host
    one_host = _preflight(run_dir, None).to_dict()
    # Two hosts, as two nodes would be: ranks 0 and 1 on node-a, rank 2 alone on node-b, slowed.
    local.hostname = lambda: "node-a" if rank < 2 else "node-b"
    _slowed(rank, slow_rank=2)
    two_hosts = _preflight(run_dir, None).to_dict()
    return [one_host, two_hosts]


def test_a_slow_rank_is_named_with_its_ratio_to_the_median(tmp_path):
    # The default slow_ratio (0.8), real multiplies: the slowed rank does 4 times the work of each.
    results = run_ranks(_slow, 3, str(tmp_path), timeout=90)
    for result, _ in results:
        assert not result["passed"]
        # With one slow rank of three, the median is a healthy rank's: only rank 1 can be below it.
        assert len(result["failures"]) == 1, result["failures"]
        line = result["failures"][0]
        assert line.startswith("rank 1 on host ") and ": matmul " in line and " of the median " in line
        ratio = float(line.split(" TFLOP/s, ")[1].split()[0])
        assert ratio < 0.5
        assert result["table"].splitlines()[2].rstrip().endswith("FAIL")
    for _, result in results:
        # A whole host slowed is named against the other hosts; the healthy host's two ranks pass.
        assert not result["passed"]
        assert len(result["failures"]) == 1, result["failures"]
        line = result["failures"][0]
        assert line.startswith("rank 2 on host node-b: matmul ") and line.endswith(" of the 2 hosts"), line
        assert float(line.split(" TFLOP/s, ")[1].split()[0]) < 0.6  # 0.25 / ((1 + 0.25) / 2) = 0.4
        status = [row.split()[-1] for row in result["table"].splitlines()[1:]]
        assert status == ["ok", "ok", "FAIL"]


def _mismatch(rank: int, world_size: int, run_dir: str) -> dict:
    from clorch.preflight import local

    if rank == 1:
        real = local.versions
        local.versions = lambda: {**real(), "torch": "2.0.0+other"}
    return _preflight(run_dir, None, slow_ratio=0.0).to_dict()


def test_a_version_mismatch_names_the_rank_and_both_versions(tmp_path):
    import torch

    results = run_ranks(_mismatch, 3, str(tmp_path), timeout=90)
    for result in results:
        assert not result["passed"]
        assert result["failures"] == [
            f"rank 1 on host {result['ranks'][1]['host']}: torch 2.0.0+other, while ranks 0, 2 have {torch.__version__}"
        ]


def _absent(rank: int, world_size: int, run_dir: str, how: str) -> dict | None:
    if rank == world_size - 1 and how == "never":
        return None  # leaves without calling the preflight
    if rank == world_size - 1:
        time.sleep(TIMEOUT_S + 2)  # arrives after the others gave up on it
    start = time.monotonic()
    result = _preflight(run_dir, None, slow_ratio=0.0)
    return {**result.to_dict(), "waited_s": time.monotonic() - start}


@pytest.mark.parametrize("how", ["never", "late"])
def test_a_rank_that_does_not_arrive_is_named_within_the_timeout(tmp_path, how):
    results = run_ranks(_absent, 3, str(tmp_path), how, timeout=90)
    for rank in (0, 1):
        result = results[rank]
        assert not result["passed"]
        assert result["failures"] == [
            f"rank 2 (on host {_host()}, by the launch layout) did not arrive within {TIMEOUT_S:g} s"
        ]
        assert result["waited_s"] < 3 * TIMEOUT_S  # the arrival deadline, not the group's 60 s
        assert result["table"].splitlines()[3].split() == ["2", "?", *["-"] * 13, "missing"]
    if how == "late":
        # The late rank learns at once that the others gave up on it: from the store, or, when
        # rank 0 (which hosts the store) has already left, from the store being gone.
        assert not results[2]["passed"]
        line = results[2]["failures"][0]
        assert "(this rank: the others had given up on it)" in line or "cannot reach the rendezvous store" in line
        assert results[2]["waited_s"] < TIMEOUT_S
    assert json.loads((tmp_path / "preflight.json").read_text())["passed"] is False


def _host() -> str:
    from clorch.preflight.local import hostname

    return hostname()


def _hung(rank: int, world_size: int, run_dir: str) -> dict:
    from clorch.preflight import timing

    if rank == 1:
        real = timing.matmul_tflops

        def stuck(*args):
            time.sleep(2 * TIMEOUT_S + 2)  # past the others' all-reduce and report deadlines
            return real(*args)

        timing.matmul_tflops = stuck
    start = time.monotonic()
    result = _preflight(run_dir, None, slow_ratio=0.0)
    return {**result.to_dict(), "waited_s": time.monotonic() - start}


def test_a_rank_hung_in_its_checks_is_named_with_where_it_was(tmp_path):
    results = run_ranks(_hung, 3, str(tmp_path), timeout=90)
    for rank in (0, 2):
        failures = results[rank]["failures"]
        assert not results[rank]["passed"]
        assert (
            f"rank 1 on host {_host()} did not report its checks within {TIMEOUT_S:g} s "
            "(last seen at: matmul)" in failures
        ), failures
        # The healthy ranks' all-reduce waited for rank 1 until its own deadline, and says which one.
        assert any(
            line.startswith(f"rank {rank} on host") and "all_reduce of 1 MiB over all 3 ranks did not finish" in line
            for line in failures
        ), failures
        assert results[rank]["waited_s"] < 4 * TIMEOUT_S
    assert not results[1]["passed"]


def _bad_checkpoint_dirs(rank: int, world_size: int, run_dir: str, under_file: str, roomy: str) -> list:
    from clorch.preflight import run_preflight

    found = []
    options = {"timeout_s": TIMEOUT_S, "slow_ratio": 0.0}  # only the directory and memory are judged here
    # A path under a regular file cannot be created, even by root (the tests may run as root,
    # for whom permission bits do not stop a write).
    found.append(run_preflight(options, run_dir=run_dir, checkpoint_dir=under_file, model_params=1000).failures)
    # A checkpoint far larger than any disk.
    found.append(
        run_preflight(
            options, run_dir=run_dir, checkpoint_dir=roomy, model_params=1000, checkpoint_bytes=1 << 60
        ).failures
    )
    # A model far larger than the host's memory (2**50 params x 4 B x 4 = 16 PiB per rank).
    found.append(run_preflight(options, run_dir=run_dir, checkpoint_dir=None, model_params=1 << 50).failures)
    return found


def test_an_unwritable_or_full_checkpoint_directory_names_the_rank(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    under_file = blocker / "ckpt"
    results = run_ranks(_bad_checkpoint_dirs, 2, str(tmp_path), str(under_file), str(tmp_path / "ckpt"), timeout=90)
    host = _host()
    for unwritable, full, too_big in results:
        assert [
            line.split(" of host memory available for 2 rank(s), the model needs an estimated ")[1][:11]
            for line in too_big
        ] == ["16 PiB each"] * 2
        assert [line.split(":")[0] for line in too_big] == [f"rank {r} on host {host}" for r in (0, 1)]
        assert unwritable == [
            f"rank {r} on host {host}: checkpoint directory {under_file} cannot be created: "
            f"{blocker} is not a directory"
            for r in (0, 1)
        ]
        assert len(full) == 2
        for r, line in enumerate(full):
            assert line.startswith(f"rank {r} on host {host}: checkpoint directory {tmp_path / 'ckpt'} has ")
            assert line.endswith(" free, a checkpoint needs an estimated 1 EiB")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "preflight.json"]
