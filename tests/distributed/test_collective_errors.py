"""Local argument checks (before any communication) and debug-mode mismatch detection."""

from __future__ import annotations

import pytest
import torch

import clorch.distributed as cd
from clorch.distributed import groups as pg
from tests.harness import run_ranks

pytestmark = pytest.mark.timeout(120)


def _raises(fn, exc, fragments):
    with pytest.raises(exc) as info:
        fn()
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))


def _bad_arguments(rank: int, world_size: int) -> None:
    x = torch.randn(4, 3)
    _raises(lambda: cd.all_reduce(x, op="mean"), ValueError, ["op must be one of", "'mean'", "avg"])
    _raises(lambda: cd.all_reduce(x, op=["sum"]), ValueError, ["op must be one of", "['sum']"])
    _raises(lambda: cd.all_reduce(torch.randn(4, 3).t()), ValueError, ["tensor must be contiguous"])
    _raises(lambda: cd.all_reduce([1, 2]), TypeError, ["tensor must be a torch.Tensor", "list"])
    _raises(lambda: cd.all_reduce(torch.arange(4), op="avg"), ValueError, ["floating-point", "int64"])
    _raises(lambda: cd.broadcast(x, src=2), ValueError, ["src must be a rank in [0, 2)", "got 2"])
    _raises(lambda: cd.reduce(x, dst=-1), ValueError, ["dst must be a rank in [0, 2)", "got -1"])
    _raises(lambda: cd.send(x, dst=rank), ValueError, ["dst must be another rank"])
    _raises(lambda: cd.recv(x, src=5), ValueError, ["src must be a rank in [0, 2)", "got 5"])
    _raises(
        lambda: cd.all_gather_into(torch.empty(7, 3), x), ValueError, ["output must have shape (8, 3)", "got (7, 3)"]
    )
    _raises(
        lambda: cd.all_gather_into(torch.empty(8, 3, dtype=torch.float64), x),
        ValueError,
        ["output must have tensor's dtype torch.float32", "torch.float64"],
    )
    _raises(
        lambda: cd.reduce_scatter_into(torch.empty(2, 3), torch.randn(5, 3)),
        ValueError,
        ["tensor must have shape (4, 3)", "got (5, 3)"],
    )
    _raises(
        lambda: cd.all_to_all_single(torch.empty(4), torch.randn(4), [1, 3], [2, 1]),
        ValueError,
        ["input_split_sizes must add up to tensor dim 0 (4)", "sum 3"],
    )
    _raises(
        lambda: cd.all_to_all_single(torch.empty(4), torch.randn(4), [4], None),
        ValueError,
        ["output_split_sizes must be 2 non-negative ints"],
    )
    _raises(
        lambda: cd.all_to_all_single(torch.empty(3), torch.randn(3)), ValueError, ["must divide evenly by world_size 2"]
    )
    meta = torch.empty(4, device="meta")
    _raises(lambda: cd.all_reduce(meta), ValueError, ["must be on cpu for backend gloo", "meta"])
    _raises(lambda: cd.wait("not work"), TypeError, ["wait() takes the Work"])
    # The group still works after all those local refusals: nothing was sent.
    cd.all_reduce(x)


def test_bad_arguments_are_refused_locally():
    run_ranks(_bad_arguments, 2)


def _shape_mismatch(rank: int, world_size: int) -> str:
    t = torch.randn(4 if rank == 0 else 5)
    try:
        cd.all_reduce(t)
    except cd.CollectiveMismatchError as exc:
        return str(exc)
    return "no error"


def test_debug_mode_catches_shape_mismatch_without_hanging():
    messages = run_ranks(_shape_mismatch, 2, env={"CLORCH_DEBUG_COLLECTIVES": "1"}, timeout=60)
    for message in messages:
        assert "collective mismatch" in message
        assert "ranks [0] called all_reduce(op=sum, shape=(4,)" in message
        assert "ranks [1] called all_reduce(op=sum, shape=(5,)" in message


def _different_collectives(rank: int, world_size: int) -> str:
    t = torch.randn(3)
    try:
        cd.all_reduce(t) if rank == 0 else cd.broadcast(t, src=0)
    except cd.CollectiveMismatchError as exc:
        return str(exc)
    return "no error"


def test_debug_mode_catches_different_collectives():
    for message in run_ranks(_different_collectives, 2, env={"CLORCH_DEBUG_COLLECTIVES": "1"}):
        assert "ranks [0] called all_reduce" in message and "ranks [1] called broadcast" in message


def test_collective_outside_a_group_is_a_clear_error():
    _raises(lambda: cd.all_reduce(torch.ones(1)), RuntimeError, ["no process group is initialized"])


def _group_destroyed_by_torch(rank: int, world_size: int) -> tuple[float, str]:
    import torch.distributed as dist

    total = torch.ones(2)
    cd.all_reduce(total)  # the usual call: a clorch group, a plain contiguous tensor on its device
    dist.destroy_process_group()  # behind clorch's back
    try:
        cd.all_reduce(torch.ones(1))
    except RuntimeError as exc:
        return total[0].item(), str(exc)
    finally:
        cd.destroy_process_group()
    return total[0].item(), "no error"


def test_a_group_destroyed_with_torch_directly_is_a_clear_error():
    for total, message in run_ranks(_group_destroyed_by_torch, 2):
        assert total == 2.0 and "no process group is initialized" in message


def _group_remade_by_torch(rank: int, world_size: int) -> tuple[bool, bool, str, float]:
    import contextlib
    import os
    import tempfile

    import torch.distributed as dist

    made_with_debug = pg.debug_enabled()
    dist.destroy_process_group()  # behind clorch's back, then a new group made with torch alone
    os.environ["CLORCH_DEBUG_COLLECTIVES"] = "0"
    path = os.path.join(tempfile.gettempdir(), f"clorch-remade-{os.environ['MASTER_PORT']}")
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world_size)
    try:
        total = torch.ones(1)
        cd.all_reduce(total)
        return made_with_debug, pg.debug_enabled(), cd.backend(), total.item()
    finally:
        dist.barrier()
        cd.destroy_process_group()
        if rank == 0:  # torch's file store may have removed it already
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


def test_a_group_remade_with_torch_directly_is_described_by_torch():
    # clorch's record of the group it made (debug mode here) must not outlive that group.
    results = run_ranks(_group_remade_by_torch, 2, env={"CLORCH_DEBUG_COLLECTIVES": "1"}, timeout=60)
    assert results == [(True, False, "gloo", 2.0)] * 2


def _split_mismatch(rank: int, world_size: int) -> str:
    # Rank 0 sends 1 row to rank 1, but rank 1 expects 2 from rank 0: without the check, gloo aborts.
    tensor = torch.randn(3, 2)
    output = torch.empty(3, 2)
    splits_in = [2, 1] if rank == 0 else [1, 2]
    splits_out = [2, 1] if rank == 0 else [2, 1]
    try:
        cd.all_to_all_single(output, tensor, splits_out, splits_in)
    except cd.CollectiveMismatchError as exc:
        return str(exc)
    return "no error"


def test_debug_mode_checks_all_to_all_split_sizes_across_ranks():
    for message in run_ranks(_split_mismatch, 2, env={"CLORCH_DEBUG_COLLECTIVES": "1"}, timeout=60):
        assert "all_to_all_single: rank 0 sends 1 rows to rank 1 (input_split_sizes=[2, 1])" in message
        assert "but rank 1 expects 2 from it (output_split_sizes=[2, 1])" in message


def _p2p(rank: int, world_size: int) -> list[str]:
    messages = []
    good = torch.arange(6.0).view(2, 3)
    if rank == 0:
        cd.send(good, 1)  # matching pair: passes and delivers
    else:
        got = torch.empty(2, 3)
        cd.recv(got, 0)
        assert torch.equal(got, good)
    for wrong in (torch.zeros(3, 2), torch.zeros(2, 3, dtype=torch.int32)):
        try:
            if rank == 0:
                cd.send(torch.zeros(2, 3), 1)
            else:
                cd.recv(wrong, 0)
        except cd.CollectiveMismatchError as exc:
            messages.append(str(exc))
    return messages


def test_debug_mode_checks_send_recv_shape_and_dtype_on_both_ranks():
    for messages in run_ranks(_p2p, 2, env={"CLORCH_DEBUG_COLLECTIVES": "1"}, timeout=60):
        assert len(messages) == 2
        assert (
            "rank 0 sends a tensor of shape=(2, 3), dtype=float32 to rank 1, which receives into "
            "shape=(3, 2), dtype=float32" in messages[0]
        )
        assert "receives into shape=(2, 3), dtype=int32" in messages[1]


def test_a_restated_failure_keeps_the_backends_class():
    import torch.distributed as dist

    from clorch.distributed.collectives import failure_like

    backend = failure_like(dist.DistBackendError("gloo: timed out"), "save_checkpoint: every rank must call it")
    assert type(backend) is dist.DistBackendError and str(backend) == "save_checkpoint: every rank must call it"
    assert type(failure_like(RuntimeError("x"), "y")) is RuntimeError

    class TakesTwo(RuntimeError):
        def __init__(self, code, text):
            super().__init__(code, text)

    assert type(failure_like(TakesTwo(1, "x"), "y")) is RuntimeError  # cannot be remade: a plain one
