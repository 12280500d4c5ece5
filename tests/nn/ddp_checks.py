"""Per-rank DDP checks, run together in one spawned job per world size (see test_ddp_ranks.py).

Each check returns plain data (weights, messages) that the test process compares
across ranks; a check that raises is recorded with its traceback.
"""

from __future__ import annotations

import copy
import traceback

import torch

import clorch.distributed as cd
from clorch.amp import GradScaler, MixedPrecision
from clorch.nn.parallel import DistributedDataParallel, no_sync
from clorch.precision import DTYPE_NAMES, torch_dtype
from clorch.strategies import adopt
from tests.nn import models as m

STEPS = 3


def strategy_for(ddp, optimizer, precision=None, rank=0, world_size=1):
    """The `DDPStrategy` that steps `ddp` (clorch's one step path): fp32 unless told otherwise."""
    precision = MixedPrecision("fp32", "cpu") if precision is None else precision
    return adopt(ddp, ddp.module, optimizer, precision, torch.device("cpu"), rank, world_size)


def _train(ddp, data, rank, world_size, micro=1, kind="sgd", use_function_form=False):
    opt = m.make_optimizer(ddp.module, kind)
    strategy = strategy_for(ddp, opt, rank=rank, world_size=world_size)
    for start in range(0, len(data), micro):
        group = data[start : start + micro]
        for i, batch in enumerate(group):
            x, y = m.shard(batch, rank, world_size)
            if i < len(group) - 1:
                ctx = no_sync(ddp) if use_function_form else ddp.no_sync()
                with ctx:
                    m.loss_fn(ddp(x), y).backward()
            else:
                m.loss_fn(ddp(x), y).backward()
        assert strategy.optimizer_step() is True
    return ddp


def _close(model, ref, **tol):
    got, want = m.weights(model), m.weights(ref)
    assert got.keys() == want.keys(), (got.keys(), want.keys())
    for key in want:
        torch.testing.assert_close(got[key], want[key], msg=key, **tol)


def check_equivalence(rank, world_size):
    """World size N x batch b == one process x N*b batch, for tiny, default and huge buckets."""
    data = m.batches(STEPS, 4 * world_size)
    ref = m.reference(m.mlp, data)
    counts = {}
    for name, cap, first in (("tiny", 1e-6, 1e-6), ("default", 25.0, 1.0), ("huge", 1e4, 1e4)):
        # Each rank starts from other weights: construction must broadcast rank 0's.
        with DistributedDataParallel(m.mlp(seed=rank), bucket_cap_mb=cap, first_bucket_cap_mb=first) as ddp:
            counts[name] = len(ddp.buckets)
            _train(ddp, data, rank, world_size)
            _close(ddp.module, ref)
    assert counts["tiny"] == 6 and counts["huge"] == 1, counts
    return counts


def check_no_sync(rank, world_size):
    """Accumulate 3 micro-batches (2 under no_sync) per step == one process summing 3 full batches."""
    data = m.batches(2 * 3, 2 * world_size, seed=11)
    ref = m.reference(m.mlp, data, micro=3)
    for form in (False, True):
        with DistributedDataParallel(m.mlp(), bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-4) as ddp:
            _train(ddp, data, rank, world_size, micro=3, use_function_form=form)
            _close(ddp.module, ref)
    return True


def check_matches_torch_ddp(rank, world_size):
    """Same model, data and bucket cap: clorch's DDP == torch's DDP (Adam, a BatchNorm model too)."""
    for build in (m.mlp, m.WithBatchNorm):
        data = m.batches(STEPS, 5 * world_size, seed=3)
        ours = DistributedDataParallel(build(seed=rank), bucket_cap_mb=1e-3, first_bucket_cap_mb=1e-4)
        theirs = torch.nn.parallel.DistributedDataParallel(build(seed=0), bucket_cap_mb=1e-3)
        opt = m.make_optimizer(theirs.module, "adam")
        _train(ours, data, rank, world_size, kind="adam")
        for batch in data:
            x, y = m.shard(batch, rank, world_size)
            m.loss_fn(theirs(x), y).backward()
            opt.step()
            opt.zero_grad()
        _close(ours.module, theirs.module)  # BatchNorm: running stats included
        assert list(ours.state_dict()) == list(theirs.state_dict())  # torch DDP's `module.` keys
        ours.load_state_dict(theirs.state_dict())  # a torch DDP state dict loads as it is
        ours.close()
    return True


def check_two_forwards_one_backward(rank, world_size):
    """Two views through a BatchNorm model, one backward (SimCLR-style) == torch's DDP, buffers broadcast."""
    data = m.batches(STEPS, 4 * world_size, seed=13)
    ours = DistributedDataParallel(m.WithBatchNorm(seed=rank), bucket_cap_mb=1e-3, first_bucket_cap_mb=1e-4)
    theirs = torch.nn.parallel.DistributedDataParallel(m.WithBatchNorm(seed=0), bucket_cap_mb=1e-3)
    for ddp in (ours, theirs):
        opt = m.make_optimizer(ddp.module, "sgd")
        for batch in data:
            x, y = m.shard(batch, rank, world_size)
            (m.loss_fn(ddp(x), y) + m.loss_fn(ddp(x.flip(0)), y.flip(0))).backward()
            opt.step()
            opt.zero_grad()
    _close(ours.module, theirs.module)  # running stats included
    ours.close()
    return True


def check_reduce_bf16(rank, world_size):
    """reduce_dtype="bf16": buckets travel in bf16, gradients stay fp32, weights ~ reference."""
    data = [(x.float(), y.float()) for x, y in m.batches(STEPS, 4 * world_size, seed=5)]
    ref = m.reference(lambda: m.mlp(torch.float32), data)
    with DistributedDataParallel(m.mlp(torch.float32), reduce_dtype="bf16") as ddp:
        assert all(b.comm.dtype == torch.bfloat16 and b.flat.dtype == torch.float32 for b in ddp.buckets)
        _train(ddp, data, rank, world_size)
        _close(ddp.module, ref, atol=3e-2, rtol=3e-2)
    return True


def check_bucket_views_accumulation_and_state_dict(rank, world_size):
    """Tiny buckets, every other backward under no_sync: .grad views the buckets, weights match.

    Also: state_dict() has torch DDP's keys, the model's own keys load, and
    close() removes every hook.
    """
    data = m.batches(4, 2 * world_size)
    ref = m.reference(m.mlp, data, micro=2)
    with DistributedDataParallel(
        m.mlp(), bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-4, reduce_dtype=torch.float32
    ) as ddp:
        assert len(ddp.buckets) > 1
        opt = m.make_optimizer(ddp.module)
        strategy = strategy_for(ddp, opt)
        for i, batch in enumerate(data):
            x, y = m.shard(batch, rank, world_size)
            if i % 2 == 0:
                with ddp.no_sync():
                    m.loss_fn(ddp(x), y).backward()
                continue
            m.loss_fn(ddp(x), y).backward()
            # .grad now views the bucket: the commit needs no copy back.
            flats = {b.flat.data_ptr() for b in ddp.buckets}
            assert all(p.grad._base is not None and p.grad._base.data_ptr() in flats for p in ddp.module.parameters())
            assert strategy.optimizer_step() is True
            assert all(p.grad is None for p in ddp.module.parameters())
        _close(ddp.module, ref, rtol=1e-5, atol=1e-6)  # float64 gradients travel as float32
        # torch DDP's keys, matching named_parameters(); the model's own keys load too.
        assert set(ddp.state_dict()) == {f"module.{k}" for k in m.mlp().state_dict()}
        assert {n for n, _ in ddp.named_parameters()} <= set(ddp.state_dict())
        ddp.load_state_dict(ref.state_dict())
        torch.testing.assert_close(ddp.module[0].weight, ref[0].weight, rtol=0, atol=0)
    # Leaving the with-block removed the hooks: backward no longer touches the buckets.
    x, y = m.shard(data[0], rank, world_size)
    assert ddp.buckets == []
    m.loss_fn(ddp.module(x), y).backward()
    assert all(p.grad._base is None for p in ddp.module.parameters())
    return True


def check_every_reduce_dtype(rank, world_size):
    """Every name of DTYPE_NAMES: buckets travel in its dtype and training matches one process."""
    data = [(x.float(), y.float()) for x, y in m.batches(2, 4 * world_size)]  # fp32 gradients

    def build():
        return m.mlp().float()

    ref = m.reference(build, data)
    comm_dtypes = {}
    for name in DTYPE_NAMES:
        comm_dtype = torch_dtype(name)
        with DistributedDataParallel(build(), reduce_dtype=name) as ddp:
            comm_dtypes[name] = sorted({str(b.comm.dtype) for b in ddp.buckets})
            for bucket in ddp.buckets:
                assert bucket.comm.dtype == comm_dtype, (name, bucket.comm.dtype)
                # Gradients already in the reduce dtype travel in place (fp32 is then the same as None).
                assert (bucket.comm is bucket.flat) == (comm_dtype == torch.float32), name
            _train(ddp, data, rank, world_size)
            # fp32: only the order of the sums differs from one process on the whole batch.
            tol = {} if comm_dtype == torch.float32 else {"rtol": 0.05, "atol": 0.02}
            _close(ddp.module, ref, **tol)
    return comm_dtypes


def check_step_without_synchronized_backward(rank, world_size):
    """Only no_sync backwards since the last step: the strategy's optimizer_step raises ValueError."""
    ddp = DistributedDataParallel(m.mlp())
    x, y = m.shard(m.batches(1, 2 * world_size)[0], rank, world_size)
    with ddp.no_sync():
        m.loss_fn(ddp(x), y).backward()
    try:
        strategy_for(ddp, m.make_optimizer(ddp.module)).optimizer_step()
    except ValueError as exc:
        return str(exc)
    finally:
        ddp.close()
    return None


def check_reduce_gradients_then_clip_with_scaler(rank, world_size):
    """reduce_gradients(), unscale_, clipping and a scaled step == one process on the whole batch."""
    data = m.batches(3, 2 * world_size, seed=9)
    plain = m.mlp()
    plain_opt, plain_scaler = m.make_optimizer(plain), GradScaler("cpu", init_scale=64.0)
    ddp = DistributedDataParallel(m.mlp(), first_bucket_cap_mb=1e-4)
    opt, scaler = m.make_optimizer(ddp.module), GradScaler("cpu", init_scale=64.0)
    strategy = strategy_for(ddp, opt, MixedPrecision("fp16", "cpu", scaler=scaler), rank, world_size)
    for batch in data:
        x, y = batch
        plain_scaler.scale(m.loss_fn(plain(x), y)).backward()
        plain_scaler.unscale_(plain_opt)
        torch.nn.utils.clip_grad_norm_(plain.parameters(), 0.5)
        plain_scaler.step(plain_opt)
        plain_scaler.update()
        plain_opt.zero_grad()

        x, y = m.shard(batch, rank, world_size)
        scaler.scale(m.loss_fn(ddp(x), y)).backward()
        ddp.reduce_gradients()  # averaged .grad now, for clipping
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 0.5)
        assert strategy.optimizer_step() is True
    _close(ddp.module, plain)
    ddp.close()
    return True


def check_second_synchronized_backward_accumulates(rank, world_size):
    """Two synchronized backwards without zero_grad: .grad sums both averages (torch's DDP too)."""
    data = m.batches(2, 2 * world_size, seed=4)
    plain = m.mlp()
    for x, y in data:
        m.loss_fn(plain(x), y).backward()
    with DistributedDataParallel(m.mlp(), first_bucket_cap_mb=1e-4) as ddp:
        for batch in data:
            x, y = m.shard(batch, rank, world_size)
            m.loss_fn(ddp(x), y).backward()
        for p, q in zip(ddp.module.parameters(), plain.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
    return True


def check_model_kinds(rank, world_size):
    """Tied weights, frozen parameters and two dtypes all match one-process training."""
    out = {}
    for name, build, tol in (
        ("tied", m.Tied, {}),
        ("frozen", m.frozen_mlp, {}),
        ("two_dtypes", m.TwoDtypes, {"atol": 1e-5, "rtol": 1e-5}),
    ):
        data = m.batches(STEPS, 3 * world_size, seed=13)
        ref = m.reference(build, data)
        with DistributedDataParallel(build(seed=rank), first_bucket_cap_mb=1e-4) as ddp:
            out[name] = sorted({str(b.flat.dtype) for b in ddp.buckets}) + [
                sum(len(b.param_indices) for b in ddp.buckets)
            ]
            _train(ddp, data, rank, world_size)
            _close(ddp.module, ref, **tol)
            out[name + "_weights"] = m.weights(ddp.module)
    return out


def check_signature_mismatch(rank, world_size):
    """The last rank's middle layer is wider: every rank raises ValueError naming it."""
    model = m.mlp()
    if rank == world_size - 1:
        model[2] = torch.nn.Linear(16, 17).double()
        model[4] = torch.nn.Linear(17, m.OUT).double()
    try:
        DistributedDataParallel(model)
    except ValueError as exc:
        return str(exc)
    return None


def check_missing_gradient(rank, world_size):
    """An unused trainable parameter: backward raises on every rank; the group still works."""
    messages = []
    ddp = DistributedDataParallel(m.Unused(), first_bucket_cap_mb=1e-5, bucket_cap_mb=1e-5)
    x, y = m.shard(m.batches(1, 2 * world_size)[0], rank, world_size)
    try:
        m.loss_fn(ddp(x), y).backward()
    except ValueError as exc:  # raised when the synchronized backward ends
        messages.append(str(exc))
    ddp.close()
    cd.barrier()
    return messages


def _local_grads(model, x, y):
    model.zero_grad(set_to_none=True)
    m.loss_fn(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def _average(grads):
    out = []
    for g in grads:
        g = g.clone()
        cd.all_reduce(g, op="avg")
        out.append(g)
    return out


def check_grad_averaged_when_backward_returns(rank, world_size):
    """Right after backward(), .grad is the average on every rank, before any other call.

    Big enough gradients (several buckets, each a large all-reduce) that a
    half-finished reduction would show; with accumulation and without.
    """
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.Tanh(), torch.nn.Linear(512, 512), torch.nn.Tanh(), torch.nn.Linear(512, 8)
    )
    plain = copy.deepcopy(model)
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.25, first_bucket_cap_mb=0.1)
    gen = torch.Generator().manual_seed(100 + rank)
    batches = [(torch.randn(16, 256, generator=gen), torch.randn(16, 8, generator=gen)) for _ in range(3)]
    for step in range(2):
        x, y = batches[step]
        expected = _average(_local_grads(plain, x, y))
        ddp.zero_grad(set_to_none=step == 0)
        m.loss_fn(ddp(x), y).backward()
        norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), float("inf"))  # reads .grad at once
        for got, want in zip([p.grad for p in ddp.module.parameters()], expected):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(
            norm,
            torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in expected])),
            rtol=1e-5,
            atol=1e-6,
        )
    # Accumulation: torch's idioms, no_sync() and require_backward_grad_sync = False.
    plain.zero_grad(set_to_none=True)
    for x, y in batches:
        m.loss_fn(plain(x), y).backward()
    expected = _average([p.grad for p in plain.parameters()])
    for style in ("no_sync", "attribute"):
        ddp.zero_grad(set_to_none=True)
        for i, (x, y) in enumerate(batches):
            last = i == len(batches) - 1
            if style == "no_sync" and not last:
                with ddp.no_sync():
                    loss = m.loss_fn(ddp(x), y)
                loss.backward()  # outside no_sync: the forward decided, no sync
            else:
                ddp.require_backward_grad_sync = last
                m.loss_fn(ddp(x), y).backward()
        for got, want in zip([p.grad for p in ddp.module.parameters()], expected):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    ddp.close()
    return True


def check_backward_accumulates_into_the_buckets(rank, world_size):
    """gradient_as_bucket_view: after zero_grad(set_to_none=True) the next forward points .grad back
    at zeroed bucket slots.

    Backward then accumulates in place (the same tensors before and after), and a
    .grad the user replaced or removed by hand is still averaged correctly.
    """
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    plain = copy.deepcopy(model)
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.01, first_bucket_cap_mb=0.001, gradient_as_bucket_view=True)
    flats = {b.flat.data_ptr() for b in ddp.buckets}
    gen = torch.Generator().manual_seed(100 + rank)
    params = list(ddp.module.parameters())
    for step in range(4):
        x, y = torch.randn(8, 32, generator=gen), torch.randn(8, 4, generator=gen)
        expected = _average(_local_grads(plain, x, y))
        ddp.zero_grad(set_to_none=True)
        if step == 2:
            params[0].grad = torch.zeros_like(params[0])  # a tensor of the user's own
        out = ddp(x)
        if step == 3:
            params[-1].grad = None  # removed between forward and backward
        slots = [p.grad for p in params]
        assert all(g is None or not g.any() for g in slots), "restored slots must be zero"
        m.loss_fn(out, y).backward()
        for got, want in zip([p.grad for p in params], expected):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert all(p.grad._base is not None and p.grad._base.data_ptr() in flats for p in params)
        if step == 1:
            assert all(p.grad is slot for p, slot in zip(params, slots)), "backward must write in place"
    ddp.close()
    return True


def _overlap_run(rank, world_size, overlap, build, reduce_dtype=None, reload_at=None):
    """AdamW with two param groups, a schedule and micro-batches; returns weights and optimizer state."""
    data = m.batches(4 * 2, 4 * world_size)
    ddp = DistributedDataParallel(
        build(seed=0), bucket_cap_mb=1e-6, first_bucket_cap_mb=1e-6, reduce_dtype=reduce_dtype
    )
    params = [p for p in ddp.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(
        [{"params": params[::2]}, {"params": params[1::2], "lr": 0.003, "weight_decay": 0.0}], lr=0.01, weight_decay=0.1
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    if overlap:
        ddp.step_in_backward(opt)
    strategy = strategy_for(ddp, opt, rank=rank, world_size=world_size)
    for step, start in enumerate(range(0, len(data), 2)):
        if step == reload_at:  # a checkpoint round trip replaces the optimizer's state dict
            opt.load_state_dict(copy.deepcopy(opt.state_dict()))
        x, y = m.shard(data[start], rank, world_size)
        with ddp.no_sync():
            m.loss_fn(ddp(x), y).backward()
        x, y = m.shard(data[start + 1], rank, world_size)
        m.loss_fn(ddp(x), y).backward()
        assert strategy.optimizer_step() is True
        schedule.step()
    buckets = len(ddp.buckets)
    ddp.close()
    state = {
        f"optimizer {index} {key}": value
        for index, entry in opt.state_dict()["state"].items()
        for key, value in entry.items()
    }
    return {**m.weights(ddp.module), **state}, buckets


def check_step_in_backward_same_numerics(rank, world_size):
    """The overlapped step gives bit-identical weights to optimizer.step() after backward."""
    results = {}
    for name, build, dtype in (
        ("mlp", m.mlp, None),
        ("two dtypes, bf16 buckets", m.TwoDtypes, "bf16"),
        ("tied", m.Tied, None),
    ):
        want, _ = _overlap_run(rank, world_size, False, build, dtype)
        got, buckets = _overlap_run(rank, world_size, True, build, dtype, reload_at=2)
        assert buckets > 1, buckets
        for key in want:
            assert torch.equal(got[key], want[key]), (name, key, got[key] - want[key])
        results[name] = buckets
    return results


def check_step_in_backward_refuses_a_second_step(rank, world_size):
    """optimizer.step() and a scaler raise ValueError; the gradients are still the average."""
    ddp = DistributedDataParallel(m.mlp(seed=0))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ddp.step_in_backward(opt)
    before = m.weights(ddp.module)
    x, y = m.shard(m.batches(1, 4 * world_size)[0], rank, world_size)
    m.loss_fn(ddp(x), y).backward()
    moved = any(not torch.equal(before[k], v) for k, v in m.weights(ddp.module).items())
    messages = []
    fp16 = strategy_for(ddp, opt, MixedPrecision("fp16", "cpu"), rank, world_size)
    for call in (opt.step, fp16.optimizer_step):
        try:
            call()
        except ValueError as error:
            messages.append(str(error))
    ddp.close()
    return moved, messages


CHECKS = {name[len("check_") :]: fn for name, fn in globals().items() if name.startswith("check_")}


def battery(rank, world_size):
    """Run every check in order; record each result or traceback (never stop early)."""
    results = {}
    for name, check in CHECKS.items():
        try:
            results[name] = ("ok", check(rank, world_size))
        except Exception:
            results[name] = ("error", traceback.format_exc())
    return results
