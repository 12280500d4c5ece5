"""The reducer's stream bookkeeping: on CPU it orders nothing; on CUDA, copies run where gradients were made."""

from __future__ import annotations

import pytest
import torch

from clorch.nn.parallel.buckets import build_buckets
from clorch.nn.parallel.fill import BucketFiller
from clorch.nn.parallel.streams import BackwardStreams

pytestmark = pytest.mark.timeout(60)


def _one_bucket(device):
    params = [torch.nn.Parameter(torch.ones(3, device=device)), torch.nn.Parameter(torch.ones(2, device=device))]
    return params, build_buckets(params, ["a", "b"], [[1, 0]], None)[0]


def test_cpu_streams_copy_then_send_and_hold_nothing():
    streams = BackwardStreams(torch.device("cpu"), copy_stream=True)
    assert streams.cuda is None and streams.copy_stream is None
    streams.start()
    assert not streams.one_stream_so_far()
    calls = []
    streams.launch(lambda b: calls.append(("copy", b)), lambda b: calls.append(("send", b)), "bucket")
    assert calls == [("copy", "bucket"), ("send", "bucket")]
    streams.hold([torch.ones(1)])
    assert streams._held == []  # only a copy stream's readers are held
    streams.wait_for_copies()
    streams.reset()


def test_filler_copies_noted_gradients_divided_and_points_grad_at_slots():
    params, bucket = _one_bucket("cpu")
    filler = BucketFiller(params, divisor=2, streams=BackwardStreams(torch.device("cpu"), copy_stream=False))
    for param in params:
        param.grad = torch.full_like(param, 4.0)
    bucket.pending = [(0, params[1].grad), (1, params[0].grad)]
    filler.copy_pending(bucket)
    filler.prepare(bucket)  # both slots copied: nothing left to divide
    assert params[0].grad.data_ptr() == bucket.grad_views[1].data_ptr()
    assert params[1].grad.data_ptr() == bucket.grad_views[0].data_ptr()
    assert torch.equal(bucket.flat, torch.full((5,), 4.0))  # copied undivided by copy_pending...
    bucket.flat.fill_(4.0)
    bucket.copied = []
    filler.prepare(bucket)  # ...slots autograd accumulated into are divided before sending
    assert torch.equal(bucket.flat, torch.full((5,), 2.0))


def test_restore_views_zeroes_and_repoints_only_unset_gradients():
    params, bucket = _one_bucket("cpu")
    filler = BucketFiller(params, divisor=1, streams=BackwardStreams(torch.device("cpu"), copy_stream=False))
    bucket.flat.fill_(7.0)
    params[1].grad = bucket.grad_views[0]
    filler.restore_views([bucket])
    assert params[0].grad.data_ptr() == bucket.grad_views[1].data_ptr()
    assert torch.equal(params[0].grad, torch.zeros(3)) and torch.equal(params[1].grad, torch.full((2,), 7.0))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_noted_gradients_are_copied_on_home_and_the_sender_waits_for_it():
    device = torch.device("cuda", 0)
    params, bucket = _one_bucket(device)
    streams = BackwardStreams(device, copy_stream=False)
    home, other = torch.cuda.current_stream(device), torch.cuda.Stream(device)
    streams.start()
    seen = {}
    with torch.cuda.stream(other):
        streams.note_current()
        bucket.pending = [(0, torch.ones(2, device=device))]
        assert not streams.one_stream_so_far()
        streams.launch(lambda b: seen.setdefault("copy", torch.cuda.current_stream(device)),
                       lambda b: seen.setdefault("send", torch.cuda.current_stream(device)), bucket)
    assert seen == {"copy": home, "send": other}
    streams.wait_for_copies()
    streams.reset()
    assert streams.home is None and streams.home_raw == 0
