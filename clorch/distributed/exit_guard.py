"""Let the process group's worker threads finish before the interpreter shuts down.

A gloo collective's work object is dropped by gloo's worker thread shortly
after the collective completes, so `wait()` can return before it is gone. If
that work holds the last reference to a Python object (a tensor whose Python
name is already gone, or, since torch 2.12, the `contextvars` context that
`backward()` keeps while it runs), dropping it needs the GIL. When the
script's last collective ends just before it exits, the main thread may
already be finalizing the interpreter: the worker thread is then stopped
while it waits for the GIL, and the process aborts with "terminate called
without an active exception" (SIGABRT) after the work finished. A script using
torch's own DistributedDataParallel aborts the same way (the race is discussed in
pytorch/pytorch#190489).

`watch_process_group()` registers, once per process, an exit handler that
releases the GIL for a moment before the interpreter finalizes, so a worker
thread waiting for it drops its work while Python can still run. clorch's
launched ranks skip finalization altogether (`clorch.launch.child.
exit_without_finalizing`); they run the exit handlers first, this one included.
"""

from __future__ import annotations

import atexit
import time

# Long enough for a worker thread that is already waiting for the GIL to take
# it, drop its work and give it back, also on a busy machine; short at exit.
_GRACE_S = 0.05
_registered = False


def watch_process_group() -> None:
    """Register the exit handler (once; later calls do nothing).

    Local to this process: no collective, nothing blocks.
    """
    global _registered
    if not _registered:
        atexit.register(_let_workers_finish)
        _registered = True


def _let_workers_finish() -> None:
    time.sleep(_GRACE_S)  # sleeping releases the GIL
