"""The gradient reducer: hooks fill flat buckets, full buckets all-reduce asynchronously.

Life of one synchronized backward, on every rank:

0. With `gradient_as_bucket_view=True`, before each forward
   `restore_views()` points every `.grad` that `zero_grad(set_to_none=True)`
   removed back at its zeroed slot of a flat bucket, so autograd accumulates
   each gradient straight into the bucket (no new tensor, no copy).
1. Each parameter's post-accumulate-grad hook counts its gradient in. A
   gradient autograd put in a new tensor (`.grad` was None) is brought into
   its slot and `.grad` pointed at the slot. By default the hook copies it at
   once, divided by world_size on the way. Where there is nothing to divide
   (one rank, a bucket in the gradients' dtype) the hook only notes it, and
   the bucket's new gradients are copied together, in one multi-tensor copy,
   when the bucket is full: fewer launches. With `overlap_grad_copies=True`
   on CUDA the hook only notes it: when the bucket is full, the bucket's new
   gradients are copied on a side stream (one multi-tensor copy, or one
   pre-divided copy each where the bucket converts to reduce_dtype), so the
   copies overlap the backward still computing on the main stream; the
   noted gradients stay allocated until the end of backward, when the
   stream that made them has waited for the copies. A parameter whose
   gradient arrives twice in one backward (a re-entrant backward) is an
   error. The first hook of the backward queues `finish()` on the autograd
   engine, to run when this backward ends.
2. When a bucket's last slot is filled, it is made ready to send (the copies
   above; the slots autograd accumulated into directly are divided by
   world_size; with the side stream, a bucket that does not convert is
   divided whole, in one kernel there), and the bucket's all-reduce (a sum)
   starts at once, overlapping the rest of backward. Buckets launch
   strictly in index order, so every rank issues the same collectives in the
   same order even when hooks fire in a slightly different order.
3. At the end of backward `finish()` waits for every bucket (on CUDA the
   current stream waits on the reductions and the copies; the host does not)
   and, for buckets that travel in `reduce_dtype`, copies the reduced values
   back into the gradient-dtype buffer that `.grad` views. So when `backward()` returns,
   `.grad` holds the average, as with torch's DistributedDataParallel.

Averaging divides *before* the sum (pre-division): with fp16 gradients near
the format's maximum, summing world_size of them first would overflow to inf
before a post-division could bring them back.

With an optimizer handed over (`step_in_backward`), each bucket's parameters
are also stepped once its all-reduce is done (`clorch.nn.parallel.overlap`).
Copying and dividing into the slots is `clorch.nn.parallel.fill`; which CUDA
streams copy, send and wait is `clorch.nn.parallel.streams`.

Nothing here reads a device value on the host.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
from torch.autograd import Variable

from clorch.distributed import collectives
from clorch.distributed.exit_guard import watch_process_group
from clorch.distributed.groups import debug_enabled
from clorch.nn.parallel.buckets import Bucket, build_buckets, plan_buckets, wait_for_reduction
from clorch.nn.parallel.fill import BucketFiller
from clorch.nn.parallel.overlap import BucketStepper
from clorch.nn.parallel.streams import BackwardStreams


class Reducer:
    """Owns the buckets and the hooks of one DistributedDataParallel model.

    With world_size > 1 it needs an initialized default process group: each
    full bucket is all-reduced over it. At world size 1 buckets are filled but
    not communicated unless `communicate=True` (DistributedDataParallel builds
    a reducer there only for `step_in_backward`, and for benchmarks).

    Args:
        params: trainable parameters, registration order.
        names: their qualified names (for error messages).
        bucket_cap_mb / first_bucket_cap_mb: see `plan_buckets`.
        reduce_dtype: dtype floating buckets travel in, or None for their own.
        world_size: the divisor of the average.
        communicate: all-reduce the buckets (default: world_size > 1). True
            at world size 1 sends each bucket to this rank alone, the whole
            path as it runs with several ranks (benchmarks measure it so).
        overlap_grad_copies: on CUDA, copy each bucket's new gradients on a
            side stream, one multi-tensor copy per bucket (ignored on CPU).
    """

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        names: Sequence[str],
        bucket_cap_mb: float,
        first_bucket_cap_mb: float,
        reduce_dtype: torch.dtype | None,
        world_size: int,
        communicate: bool | None = None,
        overlap_grad_copies: bool = False,
    ):
        self._params = list(params)
        self._names = list(names)
        plan = plan_buckets(self._params, bucket_cap_mb, first_bucket_cap_mb)
        self.buckets: list[Bucket] = build_buckets(self._params, self._names, plan, reduce_dtype)
        self._fired = [False] * len(self._params)
        self._ready = [False] * len(self.buckets)
        self._next_launch = 0
        self.sync = True  # set from DistributedDataParallel.forward
        self.committed = False  # a synchronized backward finished since the last optimizer step
        self._in_backward = False
        self._use_wrapper = debug_enabled()  # debug mode fingerprints every bucket's all-reduce
        self._communicates = world_size > 1 if communicate is None else bool(communicate)
        if self._communicates:
            watch_process_group()  # also for a group torch made
        device = self._params[0].device if self._params else torch.device("cpu")
        # overlap_grad_copies on CUDA: new gradients are copied per bucket on a copy stream.
        self._streams = BackwardStreams(device, overlap_grad_copies)
        self._filler = BucketFiller(self._params, world_size, self._streams)
        self._steps_allowed = True  # False while finish() reduces buckets a missing gradient left
        self.stepper: BucketStepper | None = None  # set by step_in_backward
        self.param_ids = frozenset(id(p) for p in self._params)
        self.params = tuple(self._params)
        self._handles = []
        for bucket in self.buckets:
            for position, index in enumerate(bucket.param_indices):
                hook = self._make_hook(index, bucket, position)
                self._handles.append(self._params[index].register_post_accumulate_grad_hook(hook))

    def _make_hook(self, index: int, bucket: Bucket, position: int):
        grad_view = bucket.grad_views[position]
        comm_view = bucket.comm_views[position]
        slot_ptr = grad_view.data_ptr()
        divisor = self._filler.divisor
        size = len(bucket.param_indices)
        # Batch the bucket's copies (one multi-tensor copy when it is full) on the side stream, and
        # wherever no division is needed: fewer launches, less host time a gradient.
        streams = self._streams
        deferred = streams.copy_stream is not None or (divisor == 1 and not bucket.converts)
        cuda_index = streams.cuda.index if streams.cuda is not None else None
        current_raw = torch._C._cuda_getCurrentRawStream if cuda_index is not None else None

        def hook(param: torch.Tensor) -> None:
            if not self.sync:
                return  # no_sync: autograd keeps accumulating into .grad locally
            if not self._in_backward:
                self._start_backward()
            if self._fired[index]:
                self._refuse_second_gradient(index)
            self._fired[index] = True
            grad = param.grad
            if grad.data_ptr() != slot_ptr:
                # Autograd made a new tensor (.grad was None).
                if current_raw is not None and current_raw(cuda_index) != streams.home_raw:
                    self._filler.copy_now(bucket, position, grad, param)
                elif deferred:
                    bucket.pending.append((position, grad))  # copied with the whole bucket when it is full
                else:
                    torch.div(grad, divisor, out=comm_view)  # a pre-divided copy into the slot
                    param.grad = grad_view
                    bucket.copied.append(position)
            bucket.filled += 1
            if bucket.filled == size:
                self._mark_ready(bucket.index)

        return hook

    def _refuse_second_gradient(self, index: int) -> None:
        """A parameter's gradient arrived twice in one backward: its first part was already sent."""
        self.abandon()
        raise ValueError(
            f"DistributedDataParallel: parameter {self._names[index]!r} received its gradient twice in "
            "one synchronized backward (a re-entrant backward, such as torch.utils.checkpoint(..., "
            "use_reentrant=True) around a parameter that is used more than once); use "
            "use_reentrant=False"
        )

    def restore_views(self) -> None:
        """Point each `.grad` that is None back at its zeroed bucket slot (see `BucketFiller.restore_views`)."""
        self._filler.restore_views(self.buckets)

    @property
    def in_backward(self) -> bool:
        """Whether a synchronized backward started and its end (finish) has not run yet."""
        return self._in_backward

    def _start_backward(self) -> None:
        """First synchronized hook of a backward: have the engine call finish() when it ends."""
        self._in_backward = True
        self._streams.start()
        Variable._execution_engine.queue_callback(self.finish)

    def _mark_ready(self, index: int) -> None:
        self._ready[index] = True
        try:
            while self._next_launch < len(self.buckets) and self._ready[self._next_launch]:
                self._launch(self.buckets[self._next_launch])
                self._next_launch += 1
        except BaseException:
            self.abandon()  # e.g. the optimizer raised in a bucket's step: this backward is over
            raise

    def _launch(self, bucket: Bucket) -> None:
        """Copy the bucket's noted gradients, pre-divide it and start its all-reduce (and step).

        On CUDA the stream that copies and sends (the copy stream with
        overlap_grad_copies, else the current one) first waits for every
        stream this backward's hooks ran on: host-side waits only.
        """
        self._streams.launch(self._filler.copy_pending, self._send_prepared, bucket)

    def _send_prepared(self, bucket: Bucket) -> None:
        self._filler.prepare(bucket)
        self._send(bucket)
        if self.stepper is not None and self.stepper.stream is not None and self._steps_allowed:
            self._hand_over(bucket)

    def _hand_over(self, bucket: Bucket) -> None:
        """CUDA: queue the bucket's step now, behind its all-reduce, on the stepper's stream.

        That stream then also converts the bucket back from reduce_dtype.
        """
        work, bucket.work = bucket.work, None
        bucket.handed = True
        self.stepper.step(bucket, work)

    def _send(self, bucket: Bucket) -> None:
        """Start the bucket's all-reduce (none when not communicating)."""
        if not self._communicates:
            bucket.work = None
        elif self._use_wrapper:
            bucket.work = collectives.all_reduce(bucket.comm, op="sum", async_op=True)
        else:
            # The buckets were checked when they were built: skip the wrapper's per-call checks.
            bucket.work = dist.all_reduce(bucket.comm, op=dist.ReduceOp.SUM, async_op=True)

    def finish(self) -> None:
        """Wait for every bucket's all-reduce and commit the averages to `.grad`.

        Runs by itself at the end of each synchronized backward (queued on the
        autograd engine by the first hook), on every rank, so callers rarely
        need it; calling it again is a no-op. It blocks until all buckets are
        reduced (on CUDA: until the reductions are ordered on the current
        stream; no host sync).

        With an optimizer handed over by `step_in_backward`, the parameters
        are stepped too by the time it returns (on CUDA: ordered on the
        current stream).

        Raises:
            ValueError: a trainable parameter got no gradient in the
                synchronized backward. The missing buckets are still reduced
                first, so ranks that did get every gradient are not left
                waiting; the error then leaves `backward()` on this rank.
                With `step_in_backward` on CUDA, buckets whose all-reduce
                started before the end of backward were already stepped; the
                others are not.
            Exception: whatever the optimizer raised stepping a bucket; the
                reducer forgets this backward first, so this rank's next one
                starts clean (with other ranks it ends the job, see `abandon`).
        """
        if not self._in_backward:
            return
        missing: list[str] = []
        try:
            if self._next_launch < len(self.buckets):
                missing = [name for name, fired in zip(self._names, self._fired) if not fired]
                self._steps_allowed = False  # reduce the rest so no rank waits, but step nothing more
                while self._next_launch < len(self.buckets):
                    self._launch(self.buckets[self._next_launch])
                    self._next_launch += 1
            self._commit_buckets(step=not missing)
        except BaseException:
            self.abandon()
            raise
        finally:
            self._steps_allowed = True
        self._reset(committed=not missing)
        if missing:
            self._raise_missing(missing)

    def _commit_buckets(self, step: bool) -> None:
        """Wait for each bucket and bring its average into `.grad` (stepping it on CPU when asked)."""
        stepper = self.stepper
        self._streams.wait_for_copies()
        for bucket in self.buckets:
            work, bucket.work = bucket.work, None
            if bucket.handed:
                bucket.handed = False  # CUDA: the side stream waits, converts and steps
            elif stepper is not None and stepper.stream is None and step:
                stepper.step(bucket, work)  # CPU: wait for this bucket, convert, step it, go on
            else:
                if work is not None:
                    wait_for_reduction(work, bucket)
                if bucket.converts:
                    bucket.flat.copy_(bucket.comm)
            bucket.filled = 0
        if stepper is not None:
            stepper.join()

    def _reset(self, committed: bool) -> None:
        self._streams.reset()
        self._fired = [False] * len(self._params)
        self._ready = [False] * len(self.buckets)
        self._next_launch = 0
        self._in_backward = False
        self.committed = committed

    def abandon(self) -> None:
        """Forget a backward that failed: wait for what was sent (no error from it), reset the buckets.

        Local. The failure itself is what the caller re-raises. With world
        size > 1 a rank whose backward failed has sent fewer buckets than its
        peers, whose all-reduces then wait for it: such a failure ends the job
        (the launcher stops the other ranks, or collective_timeout does).
        """
        for bucket in self.buckets:
            work, bucket.work = bucket.work, None
            if work is not None:
                try:
                    work.wait()
                except Exception:  # noqa: BLE001 - the original error is the one to report
                    pass
            bucket.filled, bucket.copied, bucket.pending, bucket.handed = 0, [], [], False
        self._streams.wait_for_copies()
        if self.stepper is not None:
            self.stepper.join()
        self._reset(committed=False)

    def _raise_missing(self, missing: list[str]) -> None:
        raise ValueError(
            f"DistributedDataParallel: the synchronized backward produced no gradient for trainable "
            f"parameter(s) {missing}; every trainable parameter must receive a gradient in each "
            "synchronized backward (set requires_grad=False on parameters you do not use; "
            "find_unused_parameters is unsupported). Under a re-entrant backward, such as "
            "torch.utils.checkpoint(..., use_reentrant=True), the gradients of one checkpointed "
            "segment arrive in a backward of their own: use use_reentrant=False"
        )

    def remove(self) -> None:
        """Remove every hook, after waiting for reductions and copies still in flight (local, no collective)."""
        self._streams.wait_for_copies()
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self.stepper is not None:
            self.stepper.remove()
            self.stepper = None
        for bucket in self.buckets:
            if bucket.work is not None:
                work, bucket.work = bucket.work, None
                work.wait()
        self._in_backward = False
