"""`clorch-train` on a two-node torchrun job whose rank 0 dies during start-up, before the
other node's rank has joined the job's store.

Rank 0 SIGKILLs itself at once (a node lost while the job starts). Its agent, which hosts
the ranks' store at MASTER_ADDR:MASTER_PORT (torch's agent of group rank 0), then exits.
Every other rank waits until nothing listens there any more (60 s at most) and only then
runs the real `clorch-train`, which must fail at once rather than retry its connection for
the collective timeout.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

from clorch.cli import train_main


def _wait_until_store_gone(host: str, port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=1.0).close()
        except OSError:
            return
        time.sleep(0.2)


if __name__ == "__main__":
    if os.environ["RANK"] == "0":
        os.kill(os.getpid(), signal.SIGKILL)
    _wait_until_store_gone(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    sys.exit(train_main())
