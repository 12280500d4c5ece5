"""clorch's DistributedDataParallel on 2 and 3 real gloo ranks.

Every check of `ddp_checks` runs in one spawned job per world size (spawning
is the slow part); each test below asserts one check's results.
"""

from __future__ import annotations

import pytest
import torch

from clorch.precision import DTYPE_NAMES, torch_dtype
from tests.harness import run_ranks
from tests.nn import ddp_checks

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"world{n}")
def results(request):
    world_size = request.param
    per_rank = run_ranks(ddp_checks.battery, world_size, timeout=240)
    return world_size, per_rank


def _ok(results, name):
    world_size, per_rank = results
    values = []
    for rank, ranked in enumerate(per_rank):
        status, value = ranked[name]
        assert status == "ok", f"rank {rank} of {world_size}, check {name}:\n{value}"
        values.append(value)
    return world_size, values


def test_matches_one_process_for_every_bucket_cap(results):
    _, values = _ok(results, "equivalence")
    assert all(v["tiny"] == 6 and v["huge"] == 1 for v in values)


def test_no_sync_accumulation_matches_one_process(results):
    _ok(results, "no_sync")


def test_matches_torch_ddp_including_batchnorm_buffers(results):
    _ok(results, "matches_torch_ddp")


def test_two_forwards_then_one_backward_with_broadcast_buffers(results):
    _ok(results, "two_forwards_one_backward")


def test_reduce_dtype_bf16(results):
    _ok(results, "reduce_bf16")


def test_grad_views_buckets_accumulation_state_dict_and_close(results):
    _ok(results, "bucket_views_accumulation_and_state_dict")


def test_every_reduce_dtype_builds_and_trains(results):
    _, values = _ok(results, "every_reduce_dtype")
    expected = {name: [str(torch_dtype(name))] for name in DTYPE_NAMES}
    assert all(value == expected for value in values)


def test_optimizer_step_without_synchronized_backward_raises(results):
    _, values = _ok(results, "step_without_synchronized_backward")
    for message in values:
        assert message is not None and "no synchronized backward since the last step" in message


def test_reduce_gradients_then_clip_with_scaler_matches_one_process(results):
    _ok(results, "reduce_gradients_then_clip_with_scaler")


def test_second_synchronized_backward_accumulates_as_torch_does(results):
    _ok(results, "second_synchronized_backward_accumulates")


def test_tied_frozen_and_two_dtype_models(results):
    _, values = _ok(results, "model_kinds")
    assert values[0]["tied"] == ["torch.float64", 5]  # a.weight listed once
    assert values[0]["frozen"] == ["torch.float64", 4]  # first layer excluded
    assert values[0]["two_dtypes"] == ["torch.float32", "torch.float64", 4]
    for name in ("tied_weights", "frozen_weights", "two_dtypes_weights"):
        for other in values[1:]:
            for key, tensor in values[0][name].items():
                torch.testing.assert_close(other[name][key], tensor, rtol=0, atol=0)


def test_signature_mismatch_raises_on_every_rank(results):
    world_size, values = _ok(results, "signature_mismatch")
    last = world_size - 1
    for message in values:
        assert message is not None
        assert "parameter signatures differ across ranks at parameter #2" in message
        assert "rank 0 has '2.weight' shape (16, 16)" in message
        assert f"rank {last} has '2.weight' shape (17, 16)" in message
        assert f"Ranks [{last}] differ from rank 0" in message


def test_missing_gradient_raises_from_backward_on_every_rank(results):
    _, values = _ok(results, "missing_gradient")
    for (missing,) in values:
        assert "produced no gradient for trainable parameter(s) ['unused.weight', 'unused.bias']" in missing


def test_grad_is_the_average_when_backward_returns(results):
    _ok(results, "grad_averaged_when_backward_returns")


def test_step_in_backward_is_bit_identical_to_a_step_after_backward(results):
    _, values = _ok(results, "step_in_backward_same_numerics")
    assert all(count > 1 for value in values for count in value.values())


def test_step_in_backward_refuses_optimizer_step_and_a_scaler(results):
    _, values = _ok(results, "step_in_backward_refuses_a_second_step")
    for moved, messages in values:
        assert moved
        assert len(messages) == 2
        assert "already steps inside backward" in messages[0]
        assert "a scaler cannot skip a step" in messages[1]


def test_backward_accumulates_into_the_buckets_after_set_to_none(results):
    _ok(results, "backward_accumulates_into_the_buckets")
