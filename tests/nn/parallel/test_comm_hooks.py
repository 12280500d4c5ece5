"""register_comm_hook with torch's built-in hooks == torch's DDP with the same hook (2 gloo ranks).

One spawned job runs every check (spawning is the slow part); each test
asserts one check's result.
"""

from __future__ import annotations

import copy
import traceback

import pytest
import torch
import torch.distributed as tdist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from clorch.nn.parallel import DistributedDataParallel
from tests.harness import run_ranks
from tests.nn import models as m

pytestmark = pytest.mark.timeout(300)

STEPS = 4
HOOKS = {
    "allreduce": default_hooks.allreduce_hook,
    "fp16": default_hooks.fp16_compress_hook,
    "bf16": default_hooks.bf16_compress_hook,
}


def _model() -> torch.nn.Module:
    return m.mlp(dtype=torch.float32, seed=0)


def _grads_per_step(ddp, rank, world_size) -> list[list[torch.Tensor]]:
    """Train STEPS SGD steps on this rank's shard; the averaged gradients of each step."""
    opt = m.make_optimizer(ddp.module, "sgd")
    seen = []
    for x, y in m.batches(STEPS, 6 * world_size, seed=5):
        x, y = m.shard((x.float(), y.float()), rank, world_size)
        m.loss_fn(ddp(x), y).backward()
        seen.append([p.grad.clone() for p in ddp.module.parameters()])
        opt.step()
        opt.zero_grad()
    return seen


def _same_as_torch(rank, world_size, name):
    """Gradients and weights of clorch's DDP with the hook are bit-identical to torch's DDP with it."""
    hook = HOOKS[name]
    ours = DistributedDataParallel(_model(), bucket_cap_mb=1e-3, first_bucket_cap_mb=1e-4)
    ours.register_comm_hook(None, hook)
    theirs = torch.nn.parallel.DistributedDataParallel(_model(), bucket_cap_mb=1e-3)
    theirs.register_comm_hook(None, hook)
    plain = DistributedDataParallel(_model())  # no hook: clorch's own fp32 average
    ours_grads = _grads_per_step(ours, rank, world_size)
    theirs_grads = _grads_per_step(theirs, rank, world_size)
    plain_grads = _grads_per_step(plain, rank, world_size)
    equal = all(torch.equal(a, b) for step_a, step_b in zip(ours_grads, theirs_grads) for a, b in zip(step_a, step_b))
    weights_equal = all(torch.equal(a, b) for a, b in zip(ours.module.parameters(), theirs.module.parameters()))
    differs_from_plain = any(
        not torch.equal(a, b) for step_a, step_b in zip(ours_grads, plain_grads) for a, b in zip(step_a, step_b)
    )
    hook_name = ours._get_ddp_logging_data()["comm_hook"]
    return {
        "equal": equal,
        "weights_equal": weights_equal,
        "differs_from_plain": differs_from_plain,
        "buckets": len(ours.buckets),
        "comm_hook": hook_name,
    }


def _deepcopy_keeps_the_hook(rank, world_size):
    """A deep copy of a DDP with a hook trains exactly as the original."""
    ours = DistributedDataParallel(_model(), bucket_cap_mb=1e-3, first_bucket_cap_mb=1e-4)
    ours.register_comm_hook(None, default_hooks.fp16_compress_hook)
    twin = copy.deepcopy(ours)
    a, b = _grads_per_step(ours, rank, world_size), _grads_per_step(twin, rank, world_size)
    return (
        all(torch.equal(x, y) for sa, sb in zip(a, b) for x, y in zip(sa, sb))
        and type(twin._reducer).__name__ == "HookReducer"
    )


def _errors(rank, world_size):
    """The refusals, each as (exception class name, message)."""
    out = {}

    def record(key, fn):
        try:
            fn()
            out[key] = ("no error", "")
        except Exception as exc:  # noqa: BLE001 - the test asserts the class
            out[key] = (type(exc).__name__, str(exc))

    twice = DistributedDataParallel(_model())
    twice.register_comm_hook(None, default_hooks.allreduce_hook)
    record("twice", lambda: twice.register_comm_hook(None, default_hooks.allreduce_hook))
    late = DistributedDataParallel(_model())
    late(torch.randn(2, m.IN))
    record("after_forward", lambda: late.register_comm_hook(None, default_hooks.allreduce_hook))
    state = powerSGD_hook.PowerSGDState(process_group=None)
    record("powersgd", lambda: DistributedDataParallel(_model()).register_comm_hook(state, powerSGD_hook.powerSGD_hook))
    record("not_callable", lambda: DistributedDataParallel(_model()).register_comm_hook(None, 3))
    record(
        "reduce_dtype",
        lambda: DistributedDataParallel(_model(), reduce_dtype="bf16").register_comm_hook(
            None, default_hooks.allreduce_hook
        ),
    )
    hooked = DistributedDataParallel(_model())
    hooked.register_comm_hook(None, default_hooks.allreduce_hook)
    record("then_step_in_backward", lambda: hooked.step_in_backward(torch.optim.SGD(hooked.parameters(), lr=0.1)))
    record(
        "builtin",
        lambda: DistributedDataParallel(_model())._register_builtin_comm_hook(tdist.BuiltinCommHookType.FP16_COMPRESS),
    )
    return out


def battery(rank, world_size):
    results = {}
    checks = {f"same_{name}": (lambda r, w, n=name: _same_as_torch(r, w, n)) for name in HOOKS}
    checks.update(deepcopy=_deepcopy_keeps_the_hook, errors=_errors)
    for key, check in checks.items():
        try:
            results[key] = ("ok", check(rank, world_size))
        except Exception:  # noqa: BLE001 - reported per check
            results[key] = ("error", traceback.format_exc())
    return results


@pytest.fixture(scope="module", params=[1, 2], ids=lambda n: f"world{n}")
def results(request):
    return request.param, run_ranks(battery, request.param, timeout=240)


def _ok(results, key):
    world_size, per_rank = results
    values = []
    for rank, ranked in enumerate(per_rank):
        status, value = ranked[key]
        assert status == "ok", f"rank {rank} of {world_size}, check {key}:\n{value}"
        values.append(value)
    return values


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_builtin_hook_matches_torch_ddp_bit_for_bit(results, name):
    for value in _ok(results, f"same_{name}"):
        assert value["equal"] and value["weights_equal"]
        assert value["buckets"] > 1  # several of clorch's buckets, each through the hook
        assert value["comm_hook"] == HOOKS[name].__qualname__


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_compressing_hooks_change_the_values(results, name):
    # The comparison above is not vacuous: the compressed hooks round what the plain path keeps.
    assert all(value["differs_from_plain"] for value in _ok(results, f"same_{name}"))


def test_a_deep_copy_keeps_its_hook(results):
    assert all(_ok(results, "deepcopy"))


def test_refusals(results):
    for errors in _ok(results, "errors"):
        assert errors["twice"] == (
            "RuntimeError",
            "register_comm_hook or register_builtin_comm_hook can only be called once.",
        )
        assert errors["after_forward"][0] == "RuntimeError" and "before the first forward" in errors["after_forward"][1]
        kind, message = errors["powersgd"]
        assert kind == "ValueError" and "powerSGD_hook" in message and "fp16_compress_hook" in message
        assert errors["not_callable"][0] == "TypeError"
        assert errors["reduce_dtype"][0] == "ValueError" and "reduce_dtype" in errors["reduce_dtype"][1]
        assert errors["then_step_in_backward"][0] == "ValueError"
        kind, message = errors["builtin"]
        assert kind == "NotImplementedError" and "register_comm_hook(None, default_hooks" in message
