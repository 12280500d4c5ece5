"""Process plumbing for the launcher: parent-death signals, process groups, ports, signal names.

Linux only where it matters (`prctl`); elsewhere the parent-death request is a no-op.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import threading

PR_SET_PDEATHSIG = 1
# Set by the launcher in every rank's environment, read by clorch.launch.child.
LAUNCHER_PID_VARIABLE = "CLORCH_LAUNCHER_PID"
SYS_PATH_VARIABLE = "CLORCH_SYS_PATH"

# Ports handed to jobs of this process that may still be running: bind(0) can
# return a port again as soon as it is closed, before rank 0 has bound it.
_ports_in_use: set[int] = set()
_ports_lock = threading.Lock()


def set_parent_death_signal(signum: int) -> bool:
    """Ask the kernel to send `signum` to this process when its parent *thread* exits.

    Returns False where prctl is unavailable (not Linux).
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}")
    return True


def signal_name(signum: int) -> str:
    """"SIGSEGV" for 11; "signal 99" for numbers without a name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_returncode(code: int | None) -> str | None:
    """The signal name for a negative Popen return code, else None."""
    if code is None or code >= 0:
        return None
    return signal_name(-code)


def kill_group(pgid: int, signum: int) -> bool:
    """Send `signum` to a whole process group; False when no member is left."""
    try:
        os.killpg(pgid, signum)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (an unreaped zombie is already dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as handle:
            # The state follows the parenthesised command name, which may hold spaces.
            state = handle.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (FileNotFoundError, IndexError):
        return not os.path.exists("/proc")


def reserve_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free now and not handed to another job of this process."""
    for _ in range(64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host if host in ("127.0.0.1", "localhost") else "", 0))
            port = sock.getsockname()[1]
        with _ports_lock:
            if port not in _ports_in_use:
                _ports_in_use.add(port)
                return port
    raise RuntimeError("could not find a free TCP port in 64 tries")


def release_port(port: int) -> None:
    """Forget a port reserved by `reserve_free_port` (the job using it ended)."""
    with _ports_lock:
        _ports_in_use.discard(port)
