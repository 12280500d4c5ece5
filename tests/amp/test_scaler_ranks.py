"""GradScaler across real gloo ranks: one rank's overflow makes every rank skip."""

from __future__ import annotations

import pytest
import torch

from clorch.amp import GradScaler, MixedPrecision
from clorch.nn.parallel import DistributedDataParallel
from clorch.strategies import adopt
from tests.harness import run_ranks
from tests.nn import models as m

pytestmark = pytest.mark.timeout(200)


def _scaler_only(rank, world_size):
    """Replicas without DDP on the same data: rank world_size-1 injects inf at step 1."""
    model = m.mlp()
    opt = m.make_optimizer(model)
    scaler = GradScaler("cpu", init_scale=1024.0, growth_interval=2)
    log = []
    for step, (x, y) in enumerate(m.batches(5, 3 * world_size, seed=21)):
        scaler.scale(m.loss_fn(model(x), y)).backward()
        if step == 1 and rank == world_size - 1:
            model[2].weight.grad[3, 4] = float("inf")
        before = m.weights(model)
        stepped = scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        unchanged = all(torch.equal(before[k], v) for k, v in m.weights(model).items())
        log.append((stepped, unchanged, scaler.get_scale(), scaler.skipped_steps, scaler.last_step_skipped))
    return log, m.weights(model)


def _ddp_with_scaler(rank, world_size):
    """DDP + scaler == one process, with an overflowing step (inf input on one rank) skipped."""
    data = m.batches(4, 2 * world_size, seed=23)
    ref = m.reference(m.mlp, data[:1] + data[2:])  # the reference never sees the skipped step
    scaler = GradScaler("cpu", init_scale=2.0**10)
    results = []
    with DistributedDataParallel(m.mlp(seed=rank), first_bucket_cap_mb=1e-4) as ddp:
        opt = m.make_optimizer(ddp.module)
        precision = MixedPrecision("fp16", "cpu", scaler=scaler)
        strategy = adopt(ddp, ddp.module, opt, precision, torch.device("cpu"), rank, world_size)
        for step, batch in enumerate(data):
            x, y = m.shard(batch, rank, world_size)
            if step == 1 and rank == 0:
                x = x.clone()
                x[0, 0] = float("inf")
            scaler.scale(m.loss_fn(ddp(x), y)).backward()
            results.append(strategy.optimizer_step())
        for key, value in m.weights(ref).items():
            torch.testing.assert_close(ddp.module.state_dict()[key], value, msg=key)
    return results, scaler.state_dict()


def _both(rank, world_size):
    return _scaler_only(rank, world_size), _ddp_with_scaler(rank, world_size)


@pytest.mark.parametrize("world_size", [2, 3])
def test_overflow_on_one_rank_skips_everywhere(world_size):
    per_rank = run_ranks(_both, world_size, timeout=180)
    logs = [only[0] for only, _ in per_rank]
    for log in logs:
        # step 1 overflowed on one rank only: every rank skipped, kept its weights, halved the scale.
        assert [entry[0] for entry in log] == [True, False, True, True, True]
        assert log[1][1] is True and log[1][4] is True
        assert [entry[2] for entry in log] == [1024.0, 512.0, 512.0, 1024.0, 1024.0]
        assert log[-1][3] == 1
    assert all(log == logs[0] for log in logs)
    finals = [only[1] for only, _ in per_rank]  # replicas stay identical on every rank
    for other in finals[1:]:
        for key, value in finals[0].items():
            torch.testing.assert_close(other[key], value, rtol=0, atol=0)
    for _, (stepped, state) in per_rank:
        assert stepped == [True, False, True, True]
        assert state["skipped_steps"] == 1 and state["scale"] == 512.0
