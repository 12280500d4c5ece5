"""save_checkpoint and load_checkpoint are collective: a rank that does not call them is reported.

The torch habit `if rank == 0: torch.save(...)` ported as `if rank == 0: save_checkpoint(...)`
leaves rank 0 waiting for the others. These tests check what each rank is then told: in
debug mode at once, naming the collective the other rank called instead; otherwise at the
group's timeout, with a message that says every rank must call it.
"""

from __future__ import annotations

import time

import pytest
import torch

from clorch.checkpoint import load_checkpoint, save_checkpoint
from clorch.distributed import CollectiveMismatchError, process_group
from clorch.nn.parallel import DistributedDataParallel
from tests.harness import run_ranks

pytestmark = pytest.mark.timeout(60)
GROUP_TIMEOUT = 3.0  # seconds; long enough for the group to form on a busy machine


def _rank_zero_saves_while_rank_one_steps(rank: int, world_size: int, path: str) -> str:
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 4))
    try:
        if rank == 0:
            save_checkpoint(path, model=model)
        else:  # the next step's backward: its gradient all-reduce meets rank 0's save
            model(torch.randn(3, 8)).sum().backward()
    except CollectiveMismatchError as exc:
        return str(exc)
    return "no error"


def test_debug_mode_names_the_collective_each_rank_called(tmp_path):
    messages = run_ranks(
        _rank_zero_saves_while_rank_one_steps,
        2,
        str(tmp_path / "m.ckpt"),
        env={"CLORCH_DEBUG_COLLECTIVES": "1"},
        timeout=30,
    )
    for message in messages:  # both ranks are told, and neither waits for a timeout
        assert "ranks [0] called save_checkpoint()" in message, message
        assert "ranks [1] called all_reduce(" in message, message
    assert not (tmp_path / "m.ckpt").exists()


def _one_rank_calls(rank: int, world_size: int, path: str, call: str) -> str:
    with process_group(backend="gloo", timeout=GROUP_TIMEOUT):
        model = DistributedDataParallel(torch.nn.Linear(8, 4))  # construction: both ranks meet
        try:
            if rank == 1 and call == "save":  # the next step: its all-reduce waits for rank 0
                model(torch.randn(3, 8)).sum().backward()
            elif rank == 1:
                time.sleep(GROUP_TIMEOUT + 2)  # rank 0 gives up first
                return "skipped"
            elif call == "save":
                save_checkpoint(path, model=model)
            else:
                load_checkpoint(path, model=model)
        except RuntimeError as exc:
            return str(exc)
        return "no error"


@pytest.mark.parametrize("call", ["save", "load"])
def test_a_rank_that_never_calls_is_reported_at_the_timeout(tmp_path, call):
    if call == "load":  # outside any group: an ordinary local save
        save_checkpoint(tmp_path / "m.ckpt", model=torch.nn.Linear(8, 4))
    waiting, other = run_ranks(_one_rank_calls, 2, str(tmp_path / "m.ckpt"), call, init_group=False)
    name = f"{call}_checkpoint"
    assert waiting.startswith(f"{name}: rank 0 waited for every rank to "), waiting
    assert f"{name} is collective: every rank must call it" in waiting
    assert "not only rank 0" in waiting and "CLORCH_DEBUG_COLLECTIVES=1" in waiting
    if call == "load":
        assert other == "skipped"
    else:  # the rank that went on training is told what usually causes its failed all-reduce
        assert other.startswith(
            "DistributedDataParallel: the gradient all-reduce of the bucket "
            "holding bias, weight failed on rank 1 (RuntimeError: "
        ), other
        assert "save_checkpoint on rank 0 only" in other and "CLORCH_DEBUG_COLLECTIVES=1" in other
