"""Per-rank DDP checks, run together in one spawned job per world size (see test_ddp_ranks.py).

Each check returns plain data (weights, messages) that the test process compares
across ranks; a check that raises is recorded with its traceback.
"""

from __future__ import annotations

import copy
import traceback

import torch

import clorch.distributed as cd
from clorch.nn.parallel import DistributedDataParallel, no_sync
from tests.nn import models as m

STEPS = 3


def _train(ddp, data, rank, world_size, micro=1, kind="sgd", use_function_form=False):
    opt = m.make_optimizer(ddp.module, kind)
    for start in range(0, len(data), micro):
        group = data[start:start + micro]
        for i, batch in enumerate(group):
            x, y = m.shard(batch, rank, world_size)
            if i < len(group) - 1:
                ctx = no_sync(ddp) if use_function_form else ddp.no_sync()
                with ctx:
                    m.loss_fn(ddp(x), y).backward()
            else:
                m.loss_fn(ddp(x), y).backward()
        assert ddp.optimizer_step(opt) is True
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


def check_reduce_bf16(rank, world_size):
    """reduce_dtype="bf16": buckets travel in bf16, gradients stay fp32, weights ~ reference."""
    data = [(x.float(), y.float()) for x, y in m.batches(STEPS, 4 * world_size, seed=5)]
    ref = m.reference(lambda: m.mlp(torch.float32), data)
    with DistributedDataParallel(m.mlp(torch.float32), reduce_dtype="bf16") as ddp:
        assert all(b.comm.dtype == torch.bfloat16 and b.flat.dtype == torch.float32 for b in ddp.buckets)
        _train(ddp, data, rank, world_size)
        _close(ddp.module, ref, atol=3e-2, rtol=3e-2)
    return True


def check_model_kinds(rank, world_size):
    """Tied weights, frozen parameters and two dtypes all match one-process training."""
    out = {}
    for name, build, tol in (("tied", m.Tied, {}), ("frozen", m.frozen_mlp, {}),
                             ("two_dtypes", m.TwoDtypes, {"atol": 1e-5, "rtol": 1e-5})):
        data = m.batches(STEPS, 3 * world_size, seed=13)
        ref = m.reference(build, data)
        with DistributedDataParallel(build(seed=rank), first_bucket_cap_mb=1e-4) as ddp:
            out[name] = sorted({str(b.flat.dtype) for b in ddp.buckets}) + [sum(len(b.param_indices) for b in ddp.buckets)]
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
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Tanh(),
                                torch.nn.Linear(512, 512), torch.nn.Tanh(), torch.nn.Linear(512, 8))
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
        torch.testing.assert_close(norm, torch.linalg.vector_norm(torch.stack(
            [torch.linalg.vector_norm(g) for g in expected])), rtol=1e-5, atol=1e-6)
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


CHECKS = {name[len("check_"):]: fn for name, fn in globals().items() if name.startswith("check_")}


def battery(rank, world_size):
    """Run every check in order; record each result or traceback (never stop early)."""
    results = {}
    for name, check in CHECKS.items():
        try:
            results[name] = ("ok", check(rank, world_size))
        except Exception:
            results[name] = ("error", traceback.format_exc())
    return results
