"""CUDA tier: a CUDA model's checkpoint and this rank's CUDA RNG stream survive a save and load."""

from __future__ import annotations

import pytest
import torch

from clorch.checkpoint import load_checkpoint, save_checkpoint

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(120)]


def test_cuda_weights_optimizer_and_cuda_rng_round_trip(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 16).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(8, 32, device="cuda")).sum().backward()
    optimizer.step()
    torch.cuda.manual_seed(1234)
    torch.randn(5, device="cuda")  # move the CUDA stream off its seed
    save_checkpoint(tmp_path / "c.ckpt", model=model, optimizer=optimizer)
    expected = torch.randn(7, device="cuda")  # what the stream gives right after the save

    torch.cuda.manual_seed(99)
    other = torch.nn.Linear(32, 16).cuda()
    other_opt = torch.optim.AdamW(other.parameters(), lr=0.01)
    load_checkpoint(tmp_path / "c.ckpt", model=other, optimizer=other_opt)
    assert torch.equal(torch.randn(7, device="cuda"), expected)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters()))
    assert all(p.is_cuda for p in other.parameters())
    state = next(iter(other_opt.state.values()))
    assert state["exp_avg"].is_cuda
