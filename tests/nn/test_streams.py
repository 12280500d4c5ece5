"""The reducer's parts beside its hooks: filling bucket slots, and the CUDA streams copies run on."""

from __future__ import annotations

import pytest
import torch

from clorch.nn.parallel.buckets import build_buckets
from clorch.nn.parallel.fill import BucketFiller
from clorch.nn.parallel.streams import BackwardStreams

pytestmark = pytest.mark.timeout(60)


def _one_bucket(device, reduce_dtype=None):
    params = [torch.nn.Parameter(torch.ones(3, device=device)), torch.nn.Parameter(torch.ones(2, device=device))]
    return params, build_buckets(params, ["a", "b"], [[1, 0]], reduce_dtype)[0]


def _filler(params, divisor):
    return BucketFiller(params, divisor, BackwardStreams(torch.device("cpu"), overlap_grad_copies=False))


def test_on_cpu_launch_copies_then_sends_and_nothing_is_held():
    streams = BackwardStreams(torch.device("cpu"), overlap_grad_copies=True)
    assert streams.cuda is None and streams.copy_stream is None  # no copy stream without CUDA
    streams.start()
    assert streams.home is None and not streams.one_stream_so_far()
    calls = []
    streams.launch(lambda b: calls.append(("copy", b)), lambda b: calls.append(("send", b)), "bucket")
    assert calls == [("copy", "bucket"), ("send", "bucket")]
    streams.hold([torch.ones(1)])
    assert streams._held == []  # only what a copy stream reads is held


def test_one_rank_noted_gradients_are_copied_together_and_grad_points_at_the_slots():
    params, bucket = _one_bucket("cpu")
    filler = _filler(params, divisor=1)
    grads = [torch.full((3,), 4.0), torch.full((2,), 5.0)]
    bucket.pending = [(1, grads[0]), (0, grads[1])]  # slot 0 is param 1 (planned in reverse)
    filler.copy_pending(bucket)
    filler.prepare(bucket)
    assert bucket.pending == [] and bucket.copied == []
    assert params[0].grad.data_ptr() == bucket.grad_views[1].data_ptr()
    assert params[1].grad.data_ptr() == bucket.grad_views[0].data_ptr()
    assert torch.equal(bucket.flat, torch.tensor([5.0, 5.0, 4.0, 4.0, 4.0]))


def test_a_converting_bucket_divides_noted_gradients_on_the_way_into_its_comm_buffer():
    params, bucket = _one_bucket("cpu", reduce_dtype=torch.float64)
    filler = _filler(params, divisor=2)
    bucket.pending = [(0, torch.full((2,), 5.0))]
    filler.copy_pending(bucket)
    bucket.flat[2:].fill_(4.0)  # slot 1: accumulated in place (.grad already viewed it)
    filler.prepare(bucket)
    assert bucket.comm.dtype == torch.float64
    assert torch.equal(bucket.comm, torch.tensor([2.5, 2.5, 2.0, 2.0, 2.0], dtype=torch.float64))


def test_slots_accumulated_in_place_are_divided_before_sending():
    params, bucket = _one_bucket("cpu")
    filler = _filler(params, divisor=2)
    bucket.flat.fill_(4.0)
    filler.prepare(bucket)  # nothing was copied: the whole bucket in one division
    assert torch.equal(bucket.flat, torch.full((5,), 2.0))


@pytest.mark.parametrize("preset", ["none", "one"])
def test_restore_views_zeroes_and_repoints_only_unset_gradients(preset):
    params, bucket = _one_bucket("cpu")
    bucket.flat.fill_(7.0)
    if preset == "one":
        params[1].grad = bucket.grad_views[0]  # still a view: keeps its values
    _filler(params, divisor=1).restore_views([bucket])
    assert params[0].grad.data_ptr() == bucket.grad_views[1].data_ptr()
    assert params[1].grad.data_ptr() == bucket.grad_views[0].data_ptr()
    assert torch.equal(params[0].grad, torch.zeros(3))
    assert torch.equal(params[1].grad, torch.full((2,), 7.0) if preset == "one" else torch.zeros(2))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_noted_gradients_are_copied_on_home_and_the_current_stream_sends_after_it():
    device = torch.device("cuda", 0)
    params, bucket = _one_bucket(device)
    filler = BucketFiller(params, 1, BackwardStreams(device, overlap_grad_copies=False))
    streams = filler.streams
    home, other = torch.cuda.current_stream(device), torch.cuda.Stream(device)
    streams.start()
    grad = torch.full((2,), 3.0, device=device)
    seen = {}

    def copy(b):
        seen["copy"] = torch.cuda.current_stream(device)
        torch.cuda._sleep(50_000_000)  # the copy lands late: a send that did not wait would read zeros
        filler.copy_pending(b)

    def send(b):
        seen["send"] = torch.cuda.current_stream(device)
        seen["sent"] = b.flat.clone()

    with torch.cuda.stream(other):
        streams.note_current()
        bucket.pending = [(0, grad)]
        assert not streams.one_stream_so_far()
        streams.launch(copy, send, bucket)
        streams.wait_for_copies()
    torch.cuda.synchronize(device)
    assert seen["copy"] == home and seen["send"] == other
    assert torch.equal(seen["sent"][:2].cpu(), torch.full((2,), 3.0))
    streams.reset()
    assert streams.home is None and streams.home_raw == 0
