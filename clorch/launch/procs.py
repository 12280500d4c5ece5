"""Process plumbing for the launcher: parent-death signals, process groups, orphans, ports, signal names.

Linux only where it matters (`prctl`, /proc); elsewhere the parent-death
request and the subreaper flag are no-ops and no leftover process is found.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import threading
import time
from typing import Collection, NamedTuple

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# Set by the launcher in every rank's environment, read by clorch.launch.child.
LAUNCHER_PID_VARIABLE = "CLORCH_LAUNCHER_PID"
SYS_PATH_VARIABLE = "CLORCH_SYS_PATH"
# Also in every rank's environment, and so in every descendant's that keeps it: which job of
# the launcher the process belongs to, for `end_leftovers`.
JOB_ID_VARIABLE = "CLORCH_JOB_ID"
# How long `end_leftovers` keeps at it: a process in uninterruptible sleep (stuck I/O, a
# driver call) cannot die until that returns, and the job's end must not wait for it forever.
LEFTOVERS_LIMIT_S = 10.0
_LEFTOVERS_POLL_S = 0.01

# Ranks of any job of this process that are not reaped yet: `end_leftovers` never touches
# them, whatever their session looks like (only their own supervisor's Popen may reap them).
_live_ranks: set[int] = set()
_live_ranks_lock = threading.Lock()
_subreaper_lock = threading.Lock()
_subreaper: bool | None = None


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
    """ "SIGSEGV" for 11; "signal 99" for numbers without a name."""
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


def listen_on_free_port() -> socket.socket:
    """A socket listening on a port the system chose, for rank 0's store to take over.

    Handing rank 0 the open socket, rather than a port number it binds later,
    leaves no moment in which another process (an outgoing connection given
    that ephemeral port, another job) can take the port. Like the socket torch's
    store makes itself, it listens on every address, IPv6 and IPv4 where the host
    has both, and allows a new bind while a closed store's connections linger
    (SO_REUSEADDR), so that a rank can make a second group on the same port.

    Raises:
        OSError: no socket could listen.
    """
    error: OSError | None = None
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:  # no IPv6 on this host
            error = exc
            continue
        try:
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, 0))
            sock.listen(socket.SOMAXCONN)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error


def become_child_subreaper() -> bool:
    """Make this whole process adopt its descendants' orphans (PR_SET_CHILD_SUBREAPER), once.

    Called by every supervisor thread before it spawns ranks. From then on a
    process whose parent dies is reparented to the nearest subreaper ancestor,
    i.e. here rather than to init, so a rank's descendant that left the rank's
    session (start_new_session, setsid, a double-forked daemon) can still be
    found and reaped by `end_leftovers`. Orphans of the program's own children
    come here too; they are left alone (an exited one stays a zombie until
    this process exits).

    Returns False where prctl is unavailable or refuses (not Linux): such
    escaped processes then outlive the job, as they always did.
    """
    global _subreaper
    with _subreaper_lock:
        if _subreaper is None:
            _subreaper = sys.platform.startswith("linux") and _prctl(PR_SET_CHILD_SUBREAPER, 1) == 0
        return _subreaper


def _prctl(option: int, value: int) -> int:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        return -1


def track_rank(pid: int) -> None:
    """Mark `pid` as a live rank, which `end_leftovers` must spare (its supervisor reaps it)."""
    with _live_ranks_lock:
        _live_ranks.add(pid)


def forget_rank(pid: int) -> None:
    """The rank `pid` has been reaped by its supervisor."""
    with _live_ranks_lock:
        _live_ranks.discard(pid)


class _Process(NamedTuple):
    pid: int
    ppid: int
    pgid: int
    sid: int
    zombie: bool


def _process_table() -> list[_Process]:
    """Every process /proc shows now (none where there is no /proc)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    table = []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as handle:
                # The fields follow the parenthesised command name, which may hold spaces.
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # it exited meanwhile
        table.append(_Process(int(name), int(fields[1]), int(fields[2]), int(fields[3]), fields[0] in ("Z", "X")))
    return table


def _carries_job_marker(pid: int, job_id: str) -> bool:
    """True when `pid`'s environment says it descends from this process's job `job_id`."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            entries = set(handle.read().split(b"\0"))  # a zombie's reads empty
    except OSError:
        return False
    return (
        f"{LAUNCHER_PID_VARIABLE}={os.getpid()}".encode() in entries
        and f"{JOB_ID_VARIABLE}={job_id}".encode() in entries
    )


def _leftovers(job_id: str, sessions: set[int], known: set[int]) -> list[_Process]:
    """The processes one ended job left behind, as /proc shows them now (see `end_leftovers`).

    `known` holds children of this process matched before: once they are
    zombies their environment reads empty, and a child's pid cannot be reused
    before it is reaped, so the pid alone still names them.
    """
    me = os.getpid()
    with _live_ranks_lock:
        spared = set(_live_ranks)
    return [
        p
        for p in _process_table()
        if p.pid not in spared
        and p.pid != me
        and (
            p.sid in sessions
            or p.pgid in sessions
            or (p.ppid == me and p.pid in known)
            or (p.ppid == me and not p.zombie and _carries_job_marker(p.pid, job_id))
        )
    ]


def _kill_and_reap(process: _Process) -> bool:
    """SIGKILL `process` and reap it if it is this process's child; False while it needs another look."""
    if not process.zombie:
        try:
            os.kill(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            return True
        except PermissionError:
            return True  # not ours to end (another user's): nothing more to do about it
    if process.ppid != os.getpid():
        # Its parent reaps it, or it comes here once that parent (a leftover too) has died.
        return process.zombie
    try:
        return os.waitpid(process.pid, os.WNOHANG)[0] != 0
    except ChildProcessError:
        return True  # reaped elsewhere in this process meanwhile


def end_leftovers(job_id: str, rank_pids: Collection[int], limit_s: float = LEFTOVERS_LIMIT_S) -> None:
    """SIGKILL and reap what one job's ranks left running, once all of them have been reaped.

    Called by the job's supervisor thread at the end of each attempt. It ends
    * every process in a rank's session or process group (a rank starts its
      own session, so both ids are the rank's pid), wherever it now hangs;
    * every child of this process whose environment carries this job's marker
      (LAUNCHER_PID_VARIABLE = this pid, JOB_ID_VARIABLE = `job_id`): an
      orphan that left its rank's session and was reparented here by
      `become_child_subreaper`. The program's own children and other jobs'
      ranks and descendants carry no such marker; live ranks are spared too.
    Those that are this process's children are reaped (waitpid), so no zombie
    stays. It scans again until a scan finds nothing, because a killed
    orphan's own children are reparented here in turn.

    Blocks until then, or at most `limit_s` seconds (a process stuck in
    uninterruptible sleep outlasts SIGKILL). A process that left its rank's
    session and exited on its own before this runs stays a zombie here until
    this process exits: a zombie's environment is gone, and nothing else tells
    it from the program's own children.
    """
    me = os.getpid()
    sessions, known = set(rank_pids), set()
    deadline = time.monotonic() + limit_s
    while True:
        found = _leftovers(job_id, sessions, known)
        known.update(p.pid for p in found if p.ppid == me)
        pending = [p for p in found if not _kill_and_reap(p)]
        if not pending or time.monotonic() >= deadline:
            return
        time.sleep(_LEFTOVERS_POLL_S)
