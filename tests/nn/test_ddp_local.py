"""In-process tests: bucket planning, option checks and the world-size-1 paths (no process group)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from clorch.config.schema import DDPConfig
from clorch.nn.parallel import DistributedDataParallel, no_sync
from clorch.nn.parallel.buckets import MIB, plan_buckets
from clorch.nn.parallel.ddp import REDUCE_DTYPES
from tests.nn import models as m

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


@pytest.mark.parametrize("kwargs, text", [
    ({"find_unused_parameters": True}, "find_unused_parameters=True is unsupported"),
    ({"device_mesh": "mesh"}, "device_mesh='mesh' is unsupported"),
    ({"device_ids": [0, 1]}, "device_ids must be None or a list of one device (this rank's), got [0, 1]"),
    ({"device_ids": [0]}, "device_ids must be None for a module on the CPU, got [0]"),
    ({"output_device": 0}, "output_device=0 needs device_ids naming the same device"),
    ({"process_group": "pg"}, "process_group must be None or the default process group, got 'pg'"),
    ({"reduce_dtype": "fp8"}, "reduce_dtype must be None, one of 'fp32', 'float32', 'bf16', "
                              "'bfloat16', 'fp16', 'float16' or a floating torch dtype (e.g. "
                              "torch.bfloat16), got 'fp8'"),
    ({"reduce_dtype": torch.int32}, "reduce_dtype must be None, one of 'fp32'"),
    ({"bucket_cap_mb": 0}, "bucket_cap_mb must be a finite number > 0 (MiB), got 0"),
    ({"first_bucket_cap_mb": -1.0}, "first_bucket_cap_mb must be a finite number > 0 (MiB), got -1.0"),
])
def test_bad_options_raise_value_error(kwargs, text):
    with pytest.raises(ValueError) as info:
        DistributedDataParallel(m.mlp(), **kwargs)
    assert text in str(info.value)


def test_model_must_be_a_module():
    with pytest.raises(TypeError, match="module must be a torch.nn.Module, got int"):
        DistributedDataParallel(3)
    with pytest.raises(TypeError, match="no_sync\\(\\) takes a clorch DistributedDataParallel, got Sequential"):
        with no_sync(m.mlp()):
            pass


def _train(model_or_ddp, module, data):
    opt = m.make_optimizer(module)
    for x, y in data:
        m.loss_fn(model_or_ddp(x), y).backward()
        model_or_ddp.optimizer_step(opt)


def test_world_size_one_skips_hooks_and_keeps_autograd_grads():
    ddp = DistributedDataParallel(m.mlp())
    assert ddp.buckets == []
    x, y = m.batches(1, 4)[0]
    m.loss_fn(ddp(x), y).backward()
    grads = [p.grad for p in ddp.module.parameters()]
    assert all(g is not None and g._base is None for g in grads)  # autograd's own tensors
    ref = m.reference(m.mlp, m.batches(3, 4))
    ddp = DistributedDataParallel(m.mlp())
    _train(ddp, ddp.module, m.batches(3, 4))
    for key, value in m.weights(ref).items():
        torch.testing.assert_close(ddp.module.state_dict()[key], value)


def test_full_bucket_path_at_world_size_one_matches_plain_training():
    data = m.batches(4, 5)
    ref = m.reference(m.mlp, data, micro=2)
    with DistributedDataParallel(m.mlp(), skip_at_world_size_one=False, bucket_cap_mb=1e-4,
                                 first_bucket_cap_mb=1e-4, reduce_dtype=torch.float32) as ddp:
        assert len(ddp.buckets) > 1
        opt = m.make_optimizer(ddp.module)
        for i, (x, y) in enumerate(data):
            if i % 2 == 0:
                with ddp.no_sync():
                    m.loss_fn(ddp(x), y).backward()
                continue
            m.loss_fn(ddp(x), y).backward()
            # .grad now views the bucket: the commit needs no copy back.
            flats = {b.flat.data_ptr() for b in ddp.buckets}
            assert all(p.grad._base is not None and p.grad._base.data_ptr() in flats
                       for p in ddp.module.parameters())
            assert ddp.optimizer_step(opt) is True
            assert all(p.grad is None for p in ddp.module.parameters())
        # torch DDP's keys, matching named_parameters(); the model's own keys load too.
        assert set(ddp.state_dict()) == {f"module.{k}" for k in m.mlp().state_dict()}
        assert {n for n, _ in ddp.named_parameters()} <= set(ddp.state_dict())
        ddp.load_state_dict(ref.state_dict())
        torch.testing.assert_close(ddp.module[0].weight, ref[0].weight, rtol=0, atol=0)
    # Leaving the with-block removed the hooks: backward no longer touches the buckets.
    x, y = data[0]
    assert ddp.buckets == []
    m.loss_fn(ddp.module(x), y).backward()
    assert all(p.grad._base is None for p in ddp.module.parameters())


@pytest.mark.parametrize("name, comm_dtype", [
    ("fp32", torch.float32), ("float32", torch.float32), ("bf16", torch.bfloat16),
    ("bfloat16", torch.bfloat16), ("fp16", torch.float16), ("float16", torch.float16),
])
def test_every_config_reduce_dtype_builds_and_trains(name, comm_dtype):
    choices = next(f for f in dataclasses.fields(DDPConfig) if f.name == "reduce_dtype").metadata["choices"]
    assert set(choices) == {None, *REDUCE_DTYPES}  # the schema allows exactly what the module accepts
    data = [(x.float(), y.float()) for x, y in m.batches(2, 4)]  # fp32 gradients

    def build():
        return m.mlp().float()

    ref = m.reference(build, data)
    with DistributedDataParallel(build(), skip_at_world_size_one=False, reduce_dtype=name) as ddp:
        for bucket in ddp.buckets:
            assert bucket.comm.dtype == comm_dtype
            # Gradients already in the reduce dtype travel in place (fp32 is then the same as None).
            assert (bucket.comm is bucket.flat) == (comm_dtype == torch.float32)
        _train(ddp, ddp.module, data)
        tol = {"rtol": 0, "atol": 0} if comm_dtype == torch.float32 else {"rtol": 0.05, "atol": 0.02}
        for key, value in m.weights(ref).items():
            torch.testing.assert_close(ddp.module.state_dict()[key], value, **tol)


def test_optimizer_step_without_synchronized_backward_raises():
    ddp = DistributedDataParallel(m.mlp(), skip_at_world_size_one=False)
    x, y = m.batches(1, 4)[0]
    with ddp.no_sync():
        m.loss_fn(ddp(x), y).backward()
    with pytest.raises(ValueError, match="no synchronized backward since the last step"):
        ddp.optimizer_step(m.make_optimizer(ddp.module))
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer, got str"):
        ddp.optimizer_step("sgd")


def test_reduce_gradients_then_clip_with_scaler_matches_plain_training():
    from clorch.amp import GradScaler

    data = m.batches(3, 6, seed=9)
    plain = m.mlp()
    plain_opt, plain_scaler = m.make_optimizer(plain), GradScaler("cpu", init_scale=64.0)
    ddp = DistributedDataParallel(m.mlp(), skip_at_world_size_one=False, first_bucket_cap_mb=1e-4)
    opt, scaler = m.make_optimizer(ddp.module), GradScaler("cpu", init_scale=64.0)
    for x, y in data:
        plain_scaler.scale(m.loss_fn(plain(x), y)).backward()
        plain_scaler.unscale_(plain_opt)
        torch.nn.utils.clip_grad_norm_(plain.parameters(), 0.5)
        plain_scaler.step(plain_opt)
        plain_scaler.update()
        plain_opt.zero_grad()

        scaler.scale(m.loss_fn(ddp(x), y)).backward()
        ddp.reduce_gradients()  # averaged .grad now, for clipping
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 0.5)
        assert ddp.optimizer_step(opt, scaler) is True
    for p, q in zip(ddp.module.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q)


def test_second_synchronized_backward_accumulates_as_torch_does():
    """Two synchronized backwards without zero_grad: .grad sums both averages (torch's DDP too)."""
    data = m.batches(2, 4, seed=4)
    plain = m.mlp()
    for x, y in data:
        m.loss_fn(plain(x), y).backward()
    with DistributedDataParallel(m.mlp(), skip_at_world_size_one=False, first_bucket_cap_mb=1e-4) as ddp:
        for x, y in data:
            m.loss_fn(ddp(x), y).backward()
        for p, q in zip(ddp.module.parameters(), plain.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)
