"""GPU ranks: one visible device per rank, NCCL, the default rank count. Skipped without CUDA."""

from __future__ import annotations

import os

import pytest
import torch

from clorch.launch import launch
from clorch.launch.gpus import visible_gpus

pytestmark = [pytest.mark.timeout(120), pytest.mark.cuda]


def test_gpu_ranks_each_see_one_device(tmp_path):
    visible = visible_gpus(os.environ)
    assert len(visible) == torch.cuda.device_count(), "the launcher counts GPUs as torch does"
    with launch("tests.launch.workers:cuda_all_reduce", log_dir=tmp_path, timeout=100) as job:
        status = job.wait(110)
    assert status["state"] == "succeeded", job.logs(0)["stderr"][-3000:]
    world = len(visible)
    assert len(status["results"]) == world
    expected = torch.stack(
        [torch.randn(6, generator=torch.Generator().manual_seed(3000 + r), dtype=torch.float64) for r in range(world)]
    ).sum(0)
    for rank, result in enumerate(status["results"]):
        assert (result["visible"], result["device_count"], result["device"]) == (visible[rank], 1, "cuda:0")
        assert result["backend"] == "nccl"
        torch.testing.assert_close(torch.tensor(result["sum"], dtype=torch.float64), expected)


def test_two_ranks_on_one_device_is_refused():
    with pytest.raises(ValueError, match="devices must be distinct"):
        launch("tests.launch.workers:cuda_all_reduce", devices=[0, 0])
