"""The CUDA streams one synchronized backward runs on, as the reducer sees them.

Autograd runs each gradient's hook on the stream its forward op ran on, which
is usually one stream for the whole backward (the "home" stream: the one the
backward's first hook ran on). A model that runs part of its forward on a
side stream makes some gradients on that stream; each is copied there at
once, and everything that reads the buckets waits for that stream first.
With `overlap_grad_copies`, full buckets are copied and sent on one more
stream of the reducer's (the copy stream), so the copies overlap the rest of
backward.

Every wait here is a stream wait (ordered on the device); none blocks the
host. On CPU there are no streams: `launch` copies and sends, and the waits
do nothing.
"""

from __future__ import annotations

from typing import Callable

import torch


class BackwardStreams:
    """The streams of the current backward, the copy stream, and gradients held for it.

    Args:
        device: the device of the model's parameters.
        overlap_grad_copies: on CUDA, make a copy stream (`copy_stream`) that
            copies and sends full buckets (ignored on CPU).
    """

    def __init__(self, device: torch.device, overlap_grad_copies: bool):
        self.cuda = device if device.type == "cuda" else None
        side = overlap_grad_copies and self.cuda is not None
        self.copy_stream: torch.cuda.Stream | None = torch.cuda.Stream(device) if side else None
        self.home: torch.cuda.Stream | None = None
        self.home_raw = 0  # the home stream's handle, what hooks compare the current stream with
        self._others: dict[int, torch.cuda.Stream] = {}
        # Gradients copied on the copy stream, kept alive until the streams that made them wait
        # for it (their memory is then safe to reuse there).
        self._held: list[torch.Tensor] = []

    def start(self) -> None:
        """The backward's first hook: its current stream becomes home."""
        if self.cuda is not None:
            self.home = torch.cuda.current_stream(self.cuda)
            self.home_raw = self.home.cuda_stream

    def note_current(self) -> None:
        """CUDA: a hook runs on another stream than home; bucket sends and the end of backward wait for it."""
        stream = torch.cuda.current_stream(self.cuda)
        self._others.setdefault(stream.cuda_stream, stream)

    def hold(self, grads: list[torch.Tensor]) -> None:
        """Keep gradients that the copy stream reads alive until `wait_for_copies`."""
        if self.copy_stream is not None:
            self._held.extend(grads)

    def one_stream_so_far(self) -> bool:
        """CUDA without a copy stream: every hook so far ran on the current stream (cheap to ask)."""
        return (
            self.cuda is not None
            and self.copy_stream is None
            and not self._others
            and torch._C._cuda_getCurrentRawStream(self.cuda.index) == self.home_raw
        )

    def _producers(self) -> list:
        """The streams this backward's hooks ran on (home first)."""
        return ([self.home] if self.home is not None else []) + list(self._others.values())

    def launch(self, copy: Callable, send: Callable, bucket) -> None:
        """Run `copy(bucket)` then `send(bucket)` on the stream that copies and sends.

        That is the copy stream if there is one, else the current stream; it
        first waits for every stream this backward's hooks ran on. On the copy
        stream, the gradients it reads are held (`hold`) until
        `wait_for_copies`. Without one, noted gradients are copied on the home
        stream, where they were made (the current stream may be another, when
        a bucket fills in a hook that runs elsewhere), so their memory is not
        reused there before the copy has read it.
        """
        if self.cuda is None or self.one_stream_so_far():
            copy(bucket)  # the usual case: nothing to wait for, no stream objects made
            send(bucket)
            return
        current, side = torch.cuda.current_stream(self.cuda), self.copy_stream
        waiter = current if side is None else side
        if side is not None:
            side.wait_stream(current)
        for producer in self._producers():
            if producer != current:
                waiter.wait_stream(producer)
        if side is not None:
            with torch.cuda.stream(side):
                copy(bucket)
                send(bucket)
            return
        if bucket.pending and current != self.home:
            with torch.cuda.stream(self.home):
                copy(bucket)
            current.wait_stream(self.home)
        else:
            copy(bucket)
        send(bucket)

    def wait_for_copies(self) -> None:
        """Order the current stream after this backward's copies, then release the held gradients.

        The current stream waits for the copy stream and for every other
        stream the hooks ran on; with a copy stream, those streams wait for it
        too, so the held gradients' memory is safe to reuse on them.
        """
        if self.cuda is None or self.one_stream_so_far():
            return
        current, side = torch.cuda.current_stream(self.cuda), self.copy_stream
        producers = self._producers()
        if side is not None:
            for waiter in {current, *producers}:
                waiter.wait_stream(side)
        for producer in producers:
            if producer != current:
                current.wait_stream(producer)
        self._held = []

    def reset(self) -> None:
        """Forget this backward's streams (the next backward's first hook sets home again)."""
        self.home, self.home_raw, self._others = None, 0, {}
