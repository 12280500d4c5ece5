"""In-process tests: bucket planning, option checks and the world-size-1 fast path (no process group).

The bucket path needs a process group of two or more ranks: `ddp_checks` runs it on real gloo ranks.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import typing

import pytest
import torch

from clorch.amp import MixedPrecision
from clorch.config.schema import DDPConfig
from clorch.nn.parallel import DistributedDataParallel, no_sync
from clorch.nn.parallel.buckets import MIB, plan_buckets
from clorch.nn.parallel.ddp import resolve_reduce_dtype
from clorch.precision import DTYPE_NAMES
from tests.nn import models as m
from tests.nn.ddp_checks import strategy_for

pytestmark = pytest.mark.timeout(60)


def _params(*numels, dtype=torch.float32):
    return [torch.nn.Parameter(torch.randn(n, dtype=dtype)) for n in numels]


def test_plan_reverse_order_first_bucket_small_and_oversized_alone():
    floats = MIB // 4  # one MiB of float32
    params = _params(floats, floats // 2, 3 * floats, floats // 4, floats // 4)
    plan = plan_buckets(params, bucket_cap_mb=2.0, first_bucket_cap_mb=0.5)
    # Reverse order: 4 and 3 fill the 0.5 MiB first bucket; 2 (3 MiB) is alone; 1 and 0 share.
    assert plan == [[4, 3], [2], [1, 0]]


def test_plan_one_dtype_per_bucket_in_arrival_order():
    params = _params(10, 10) + _params(10, dtype=torch.float64) + _params(10)
    plan = plan_buckets(params, bucket_cap_mb=1.0, first_bucket_cap_mb=1.0)
    assert plan == [[3, 1, 0], [2]]
    for bucket in plan:
        assert len({params[i].dtype for i in bucket}) == 1


@pytest.mark.parametrize(
    "kwargs, text",
    [
        ({"find_unused_parameters": True}, "find_unused_parameters=True is unsupported"),
        ({"device_mesh": "mesh"}, "device_mesh='mesh' is unsupported"),
        ({"device_ids": [0, 1]}, "device_ids must be None or a list of one device (this rank's), got [0, 1]"),
        ({"device_ids": [0]}, "device_ids must be None for a module on the CPU, got [0]"),
        ({"output_device": 0}, "output_device=0 needs device_ids naming the same device"),
        ({"process_group": "pg"}, "process_group must be None or the default process group, got 'pg'"),
        (
            {"reduce_dtype": "fp8"},
            "reduce_dtype must be None, one of 'fp32', 'float32', 'bf16', "
            "'bfloat16', 'fp16', 'float16' or a floating torch dtype (e.g. "
            "torch.bfloat16), got 'fp8'",
        ),
        ({"reduce_dtype": torch.int32}, "reduce_dtype must be None, one of 'fp32'"),
        ({"bucket_cap_mb": 0}, "bucket_cap_mb must be a finite number > 0 (MiB), got 0"),
        ({"first_bucket_cap_mb": -1.0}, "first_bucket_cap_mb must be a finite number > 0 (MiB), got -1.0"),
    ],
)
def test_bad_options_raise_value_error(kwargs, text):
    with pytest.raises(ValueError) as info:
        DistributedDataParallel(m.mlp(), **kwargs)
    assert text in str(info.value)


def test_model_must_be_a_module():
    with pytest.raises(TypeError, match="module must be a torch.nn.Module, got int"):
        DistributedDataParallel(3)
    with pytest.raises(TypeError, match="overlap_grad_copies must be a bool, got 'yes'"):
        DistributedDataParallel(m.mlp(), overlap_grad_copies="yes")
    with pytest.raises(TypeError, match="no_sync\\(\\) takes a clorch DistributedDataParallel, got Sequential"):
        with no_sync(m.mlp()):
            pass


def _train(ddp, data):
    opt = m.make_optimizer(ddp.module)
    strategy = strategy_for(ddp, opt)
    for x, y in data:
        m.loss_fn(ddp(x), y).backward()
        strategy.optimizer_step()


def test_world_size_one_skips_hooks_and_keeps_autograd_grads():
    ddp = DistributedDataParallel(m.mlp())
    assert ddp.buckets == []
    x, y = m.batches(1, 4)[0]
    m.loss_fn(ddp(x), y).backward()
    grads = [p.grad for p in ddp.module.parameters()]
    assert all(g is not None and g._base is None for g in grads)  # autograd's own tensors
    ref = m.reference(m.mlp, m.batches(3, 4))
    ddp = DistributedDataParallel(m.mlp())
    _train(ddp, m.batches(3, 4))
    for key, value in m.weights(ref).items():
        torch.testing.assert_close(ddp.module.state_dict()[key], value)


@pytest.mark.parametrize(
    "name, comm_dtype",
    [
        ("fp32", torch.float32),
        ("float32", torch.float32),
        ("bf16", torch.bfloat16),
        ("bfloat16", torch.bfloat16),
        ("fp16", torch.float16),
        ("float16", torch.float16),
    ],
)
def test_every_config_reduce_dtype_resolves(name, comm_dtype):
    # Buckets and training with each name: ddp_checks.check_every_reduce_dtype (real ranks).
    choices = typing.get_args(typing.get_type_hints(DDPConfig)["reduce_dtype"])
    assert set(choices) == {None, *DTYPE_NAMES}  # the schema allows exactly what the module accepts
    assert resolve_reduce_dtype(name) == comm_dtype


class _ScalerThatCannotStep(MixedPrecision):
    """A precision object whose loss scaler is not one."""

    scaler = "scaler"


def test_optimizer_step_checks_its_arguments():
    # Without a synchronized backward it raises ValueError: ddp_checks (real ranks, hooks registered).
    ddp = DistributedDataParallel(m.mlp())
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer, got str"):
        strategy_for(ddp, "sgd").optimizer_step()
    with pytest.raises(TypeError, match="scaler must be a clorch.amp.GradScaler or None, got str"):
        strategy_for(ddp, m.make_optimizer(ddp.module), _ScalerThatCannotStep("fp32", "cpu")).optimizer_step()


def test_the_wrapper_wraps_and_the_strategy_steps():
    """clorch's DDP has no step, scaler or clipping path of its own beside DDPStrategy's; the
    precision object takes the buckets (flats), not the wrapper, so clorch.amp never calls into it."""
    from clorch.nn.parallel import grad_norm

    for name in ("optimizer_step", "unscale_gradients"):
        assert not hasattr(DistributedDataParallel, name), name
    assert not hasattr(grad_norm, "clip_grad_norm")
    assert list(inspect.signature(MixedPrecision.optimizer_step).parameters) == ["self", "optimizer", "flats"]
    # What a strategy reads or marks is all the wrapper offers it: no optimizer is stepped there.
    ddp = DistributedDataParallel(m.mlp())
    opt = m.make_optimizer(ddp.module)
    x, y = m.batches(1, 4)[0]
    m.loss_fn(ddp(x), y).backward()
    before = m.weights(ddp.module)
    ddp.begin_step()
    assert ddp.flat_gradients(opt) is None and ddp.optimizer_in_backward is None  # one rank: no reducer
    ddp.end_step()
    assert all(torch.equal(before[k], v) for k, v in m.weights(ddp.module).items())
    assert all(p.grad is not None for p in ddp.module.parameters())  # zeroing is the strategy's


def test_clorch_nn_imports_no_config_code():
    # clorch.nn is a library layer: importing it must not pull in Hydra or clorch's config.
    code = (
        "import sys, clorch.nn, clorch.nn.parallel.ddp, clorch.nn.parallel.reducer; "
        "bad = sorted(m for m in sys.modules if m.startswith(('clorch.config', 'clorch.engine', 'hydra'))); "
        "sys.exit(f'clorch.nn imported {bad}' if bad else 0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("cap_mb", [1e-6, 25.0])  # one parameter a bucket; all six in one
def test_reducer_at_world_size_one_puts_each_new_gradient_in_its_bucket(cap_mb):
    """Divisor 1 (one rank): hooks note new gradients, each full bucket copies them into its slots
    together and points .grad there; a backward under no_sync first accumulates as usual."""
    from clorch.nn.parallel.reducer import Reducer

    plain, model = m.mlp(), m.mlp()
    named = list(model.named_parameters())
    reducer = Reducer([p for _, p in named], [n for n, _ in named], cap_mb, cap_mb, None, world_size=1)
    assert len(reducer.buckets) == (6 if cap_mb < 1 else 1)
    flats = {b.flat.data_ptr() for b in reducer.buckets}
    (x0, y0), *data = m.batches(3, 8)
    for x, y in data:
        m.loss_fn(plain(x0), y0).backward()
        reducer.sync = False  # what DistributedDataParallel.no_sync() sets
        m.loss_fn(model(x0), y0).backward()
        reducer.sync = True
        m.loss_fn(plain(x), y).backward()
        m.loss_fn(model(x), y).backward()
        assert reducer.committed
        for p, q in zip(model.parameters(), plain.parameters()):
            assert p.grad._base is not None and p.grad._base.data_ptr() in flats
            assert torch.equal(p.grad, q.grad)
        assert all(not b.pending and not b.copied for b in reducer.buckets)
        for params in (plain.parameters(), model.parameters()):
            for p in params:
                p.grad = None
    reducer.remove()


def test_step_in_backward_at_world_size_one_matches_a_plain_loop():
    data = m.batches(4, 8)
    plain = m.mlp()
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=0.01)
    ddp = DistributedDataParallel(m.mlp(), bucket_cap_mb=1e-6, first_bucket_cap_mb=1e-6)
    opt = torch.optim.AdamW(ddp.parameters(), lr=0.01)
    ddp.step_in_backward(opt)
    assert len(ddp.buckets) == 6  # the bucket path runs, with nothing to communicate
    strategy = strategy_for(ddp, opt)
    for x, y in data:
        m.loss_fn(plain(x), y).backward()
        plain_opt.step()
        plain_opt.zero_grad()
        m.loss_fn(ddp(x), y).backward()
        assert strategy.optimizer_step() is True
    for key, want in m.weights(plain).items():
        assert torch.equal(m.weights(ddp.module)[key], want), key


def test_step_in_backward_refuses_what_it_cannot_step():
    ddp = DistributedDataParallel(m.mlp())
    with pytest.raises(TypeError, match="takes a torch.optim.Optimizer, got str"):
        ddp.step_in_backward("adamw")
    with pytest.raises(ValueError, match="steps each parameter on its own .* got LBFGS"):
        ddp.step_in_backward(torch.optim.LBFGS(ddp.parameters()))
    with pytest.raises(ValueError, match="the model has 6, the optimizer 1, 1 of them not the model's"):
        ddp.step_in_backward(torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1))
    ddp.step_in_backward(torch.optim.SGD(ddp.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="already called on this model \\(with a SGD\\)"):
        ddp.step_in_backward(torch.optim.SGD(ddp.parameters(), lr=0.1))


class _Failing(torch.optim.SGD):
    """An SGD whose step fails once, on its second call."""

    calls = 0

    def step(self, closure=None):
        type(self).calls += 1
        if type(self).calls == 2:
            raise RuntimeError("optimizer failed")
        return super().step(closure)


def test_a_failing_bucket_step_leaves_the_reducer_ready_for_the_next_backward():
    ddp = DistributedDataParallel(m.mlp(), bucket_cap_mb=1e-6, first_bucket_cap_mb=1e-6)
    opt = _Failing(ddp.parameters(), lr=0.1)
    ddp.step_in_backward(opt)
    x, y = m.batches(1, 8)[0]
    with pytest.raises(RuntimeError, match="optimizer failed"):
        m.loss_fn(ddp(x), y).backward()
    reducer = ddp._reducer
    assert not reducer._in_backward and all(b.filled == 0 and not b.copied for b in ddp.buckets)
    ddp.zero_grad(set_to_none=True)
    before = m.weights(ddp.module)
    m.loss_fn(ddp(x), y).backward()  # a clean backward again: every bucket stepped, committed
    assert reducer.committed
    assert all(not torch.equal(before[k], v) for k, v in m.weights(ddp.module).items())


def test_step_in_backward_follows_a_cleared_or_reloaded_adam_state():
    data = m.batches(4, 8)
    plain, ddp = m.mlp(), DistributedDataParallel(m.mlp(), bucket_cap_mb=1e-6, first_bucket_cap_mb=1e-6)
    plain_opt, opt = torch.optim.Adam(plain.parameters(), lr=0.01), torch.optim.Adam(ddp.parameters(), lr=0.01)
    ddp.step_in_backward(opt)
    strategy = strategy_for(ddp, opt)
    for index, (x, y) in enumerate(data):
        if index == 2:  # both forget their moments (as a fresh optimizer state would)
            plain_opt.state.clear()
            opt.state.clear()
        m.loss_fn(plain(x), y).backward()
        plain_opt.step()
        plain_opt.zero_grad()
        m.loss_fn(ddp(x), y).backward()
        strategy.optimizer_step()
    assert len(opt.state) == len(plain_opt.state) == 6
    for key, want in m.weights(plain).items():
        assert torch.equal(m.weights(ddp.module)[key], want), key


def test_step_in_backward_keeps_a_custom_optimizers_attributes_and_allows_frozen_parameters():
    class Scaled(torch.optim.SGD):
        def __init__(self, params, alpha):
            super().__init__(params, lr=0.1)
            self.alpha = alpha

        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-self.alpha)

    model = m.mlp()
    model[0].weight.requires_grad_(False)
    ddp = DistributedDataParallel(model)
    ddp.step_in_backward(Scaled(model.parameters(), alpha=0.5))  # holds the frozen weight too
    x, y = m.batches(1, 8)[0]
    before = m.weights(model)
    m.loss_fn(ddp(x), y).backward()
    after = m.weights(model)
    assert torch.equal(after["0.weight"], before["0.weight"])
    assert not torch.equal(after["2.weight"], before["2.weight"])


def test_a_backward_that_fails_outside_the_reducer_does_not_wedge_the_next_one():
    ddp = DistributedDataParallel(m.mlp(), bucket_cap_mb=1e-6, first_bucket_cap_mb=1e-6)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ddp.step_in_backward(opt)
    x, y = m.batches(1, 8)[0]

    def fail(grad):
        raise RuntimeError("a user hook failed")

    handle = ddp.module[0].weight.register_hook(fail)  # fires after the later layers' buckets
    with pytest.raises(RuntimeError, match="a user hook failed"):
        m.loss_fn(ddp(x), y).backward()
    handle.remove()
    assert ddp._reducer.in_backward  # autograd dropped the end-of-backward callback
    ddp.zero_grad(set_to_none=True)
    before = m.weights(ddp.module)
    m.loss_fn(ddp(x), y).backward()  # the forward started clean: every bucket stepped
    assert ddp._reducer.committed and not ddp._reducer.in_backward
    assert all(not torch.equal(before[k], v) for k, v in m.weights(ddp.module).items())


@pytest.mark.parametrize("world_size", [1, 2])  # 1: hooks note gradients and buckets copy them together
def test_a_gradient_arriving_twice_in_one_backward_is_refused(world_size):
    """A re-entrant checkpoint around a parameter used twice accumulates its gradient twice:
    the first part would already be divided and sent, so it is an error, not a wrong average."""
    from torch.utils.checkpoint import checkpoint

    from clorch.nn.parallel.reducer import Reducer

    torch.manual_seed(0)
    shared, head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    params = [*shared.parameters(), *head.parameters()]
    reducer = Reducer(
        params,
        ["shared.weight", "shared.bias", "head.weight", "head.bias"],
        25.0,
        1.0,
        None,
        world_size,
        communicate=False,
    )
    x = torch.randn(3, 4, requires_grad=True)
    h = checkpoint(lambda t: shared(t).tanh(), x, use_reentrant=True)
    h = checkpoint(lambda t: shared(t).tanh(), h, use_reentrant=True)
    with pytest.raises(ValueError, match="'shared.(weight|bias)' received its gradient twice .*use_reentrant=False"):
        head(h).sum().backward()
    assert not reducer.in_backward and not reducer.committed
    assert all(not b.pending and not b.copied for b in reducer.buckets)
    reducer.remove()


@pytest.mark.parametrize("world_size", [1, 2])
def test_a_model_inside_reentrant_checkpoints_is_told_to_use_non_reentrant_ones(world_size):
    """When the first gradient arrives inside a checkpoint's own backward, the end of that inner
    backward looks like the end of the whole one: the error names the cause and the fix."""
    from torch.utils.checkpoint import checkpoint

    from clorch.nn.parallel.reducer import Reducer

    a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    reducer = Reducer(
        [*a.parameters(), *b.parameters()],
        ["a.weight", "a.bias", "b.weight", "b.bias"],
        25.0,
        1.0,
        None,
        world_size,
        communicate=False,
    )
    x = torch.randn(3, 4, requires_grad=True)
    h = checkpoint(lambda t: a(t).tanh(), x, use_reentrant=True)
    h = checkpoint(lambda t: b(t).tanh(), h, use_reentrant=True)
    with pytest.raises(ValueError, match=r"\['a.weight', 'a.bias'\].*use_reentrant=True.*use use_reentrant=False"):
        h.sum().backward()
    reducer.remove()


def test_non_reentrant_checkpoints_around_a_reused_parameter_average_exactly():
    """torch.utils.checkpoint(use_reentrant=False) keeps one backward: each gradient arrives once."""
    from torch.utils.checkpoint import checkpoint

    from clorch.nn.parallel.reducer import Reducer

    def build():
        torch.manual_seed(0)
        return torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)

    def loss(shared, head, x):
        h = checkpoint(lambda t: shared(t).tanh(), x, use_reentrant=False)
        h = checkpoint(lambda t: shared(t).tanh(), h, use_reentrant=False)
        return head(h).sum()

    x = torch.randn(3, 4)
    plain = build()
    loss(*plain, x).backward()
    shared, head = build()
    params = [*shared.parameters(), *head.parameters()]
    reducer = Reducer(
        params, ["shared.weight", "shared.bias", "head.weight", "head.bias"], 25.0, 1.0, None, 2, communicate=False
    )
    loss(shared, head, x).backward()
    assert reducer.committed
    for p, q in zip(params, [*plain[0].parameters(), *plain[1].parameters()]):
        torch.testing.assert_close(p.grad, q.grad / 2, rtol=0, atol=0)
    reducer.remove()
