"""Filling the reducer's buckets: each gradient into its slot, pre-divided, ready to send.

A slot gets its gradient one of three ways: autograd accumulated straight
into it (`.grad` already viewed it), a hook copied a new gradient at once, or
a hook noted the new gradient and `copy_pending` copies the bucket's noted
ones together when the bucket is full. Before the bucket is sent,
`prepare` divides by world_size whatever was not divided on the way in.
Every function here is local (no collective) and never reads a device value
on the host.
"""

from __future__ import annotations

from typing import Sequence

import torch

from clorch.nn.parallel.buckets import Bucket
from clorch.nn.parallel.streams import BackwardStreams


class BucketFiller:
    """Copies, divides and re-points gradients for the buckets of one reducer.

    Args:
        params: the reducer's parameters (bucket slots index into them).
        divisor: world_size, the divisor of the average.
        streams: the backward's streams (where copies run, what is held).
    """

    def __init__(self, params: Sequence[torch.nn.Parameter], divisor: int, streams: BackwardStreams):
        self.params = params  # the reducer's list, shared
        self.divisor = divisor
        self.streams = streams

    def copy_now(self, bucket: Bucket, position: int, grad: torch.Tensor, param: torch.Tensor) -> None:
        """A gradient made on another stream than the backward's first: copy it now, on that stream.

        (So its memory is reused there only after the copy.) Undivided where
        the side stream divides the whole bucket or there is nothing to divide.
        The bucket's all-reduce and `finish` wait for this stream.
        """
        self.streams.note_current()
        target = bucket.comm_views[position]
        if bucket.converts or (self.streams.copy_stream is None and self.divisor != 1):
            torch.div(grad, self.divisor, out=target)
        else:
            target.copy_(grad)
        param.grad = bucket.grad_views[position]
        bucket.copied.append(position)

    def copy_pending(self, bucket: Bucket) -> None:
        """The bucket's noted new gradients into their slots (overlap_grad_copies: on the copy stream).

        One multi-tensor copy where the bucket travels in the gradients'
        dtype (on the copy stream the division follows, for the whole bucket);
        a pre-divided copy per gradient where it converts to reduce_dtype.

        On the copy stream each gradient tensor is held until
        `BackwardStreams.wait_for_copies` at the end of backward, so its memory is not
        reused before the copy has read it. That keeps up to one more set of
        gradients alive until then; `record_stream` would free each one once
        its copy is done, but adds an event per tensor that the allocator
        polls on every allocation.
        """
        pending, bucket.pending = bucket.pending, []
        if not pending:
            return
        targets, grads = [bucket.comm_views[position] for position, _ in pending], [grad for _, grad in pending]
        if bucket.converts:
            for target, grad in zip(targets, grads):
                torch.div(grad, self.divisor, out=target)
        else:
            torch._foreach_copy_(targets, grads)
        params, indices = self.params, bucket.param_indices
        self.streams.hold(grads)
        for position, _ in pending:
            params[indices[position]].grad = bucket.grad_views[position]
            bucket.copied.append(position)

    def _divide_in_place_slots(self, bucket: Bucket) -> None:
        """Pre-divide (and convert to `comm`) the slots autograd accumulated into directly, before sending."""
        if self.divisor == 1 and not bucket.converts:
            return
        if not bucket.copied:
            torch.div(bucket.flat, self.divisor, out=bucket.comm)  # one kernel for the bucket
            return
        done = set(bucket.copied)
        for position, (grad_view, comm_view) in enumerate(zip(bucket.grad_views, bucket.comm_views)):
            if position not in done:
                torch.div(grad_view, self.divisor, out=comm_view)

    def prepare(self, bucket: Bucket) -> None:
        """Make the bucket's `comm` hold what this rank sends: every slot filled, pre-divided.

        The noted gradients are copied by the caller first (`copy_pending`)."""
        if self.streams.copy_stream is not None:
            if not bucket.converts:
                if self.divisor != 1:
                    bucket.flat.div_(self.divisor)  # copied and accumulated slots alike, one kernel
                bucket.copied = []
                return
        if len(bucket.copied) != len(bucket.param_indices):
            self._divide_in_place_slots(bucket)
        bucket.copied = []

    def restore_views(self, buckets: list[Bucket]) -> None:
        """Point each `.grad` that is None (zero_grad(set_to_none=True)) back at its zeroed slot.

        Called (with gradient_as_bucket_view=True) before each forward that
        records a graph, so the coming backward accumulates straight into the
        buckets: no gradient is allocated and none is copied. Local; a bucket
        whose gradients are all None is zeroed with one kernel.
        """
        params = self.params
        for bucket in buckets:
            indices = bucket.param_indices
            if params[indices[0]].grad is not None and params[indices[-1]].grad is not None:
                continue  # still views (or user-set tensors, which the hooks copy)
            unset = [position for position, i in enumerate(indices) if params[i].grad is None]
            if len(unset) == len(indices):
                bucket.flat.zero_()
            else:
                for position in unset:
                    bucket.grad_views[position].zero_()
            for position in unset:
                params[indices[position]].grad = bucket.grad_views[position]
