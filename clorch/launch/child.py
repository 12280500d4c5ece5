"""A rank's entry point: `python -m clorch.launch.child --main pkg.mod:fn --log-dir DIR --backend B`.

In order:
1. Ask for SIGKILL when the launcher goes (PR_SET_PDEATHSIG), and exit at
   once if it is already gone.
2. Fork a sentinel into this rank's process group (the rank leads its own
   session). It ignores SIGTERM/SIGINT and waits for the rank to die, however
   it dies, then SIGKILLs the group: the rank's own children (data-loader
   workers, subprocesses) never outlive it, even when nobody is left to reap.
3. Import `main`, join the process group (unless backend is "none"), call
   `main(ctx)`, leave the group. A JSON-serializable return value goes to
   rank_{r}.result.json; an exception (or sys.exit with a non-zero code) goes
   to rank_{r}.error.json with its type, message and traceback, and to
   stderr; the exit code is Python's own (1, or sys.exit's code).
4. Leave through `exit_without_finalizing`: atexit handlers run, interpreter finalization
   does not (see there why).

Nothing here imports torch before step 3, and nothing at all without a backend.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from clorch._files import write_json_atomic
from clorch._gc import import_long_lived
from clorch.env import STORE_FD_VARIABLE
from clorch.launch.procs import LAUNCHER_PID_VARIABLE, SYS_PATH_VARIABLE, set_parent_death_signal


def _guard_parent() -> None:
    """Die with the launcher. The ppid check closes the race with a launcher dying before prctl."""
    expected = os.environ.get(LAUNCHER_PID_VARIABLE)
    set_parent_death_signal(signal.SIGKILL)
    if expected and os.getppid() != int(expected):
        os._exit(128 + signal.SIGKILL)


def _start_sentinel() -> None:
    """Fork the process that kills this rank's group once the rank has died (see module doc)."""
    rank_pid = os.getpid()
    if os.fork() != 0:
        return
    try:
        _close_store_socket()  # the rank's alone: a copy here would hold the port past its use
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # Blocked before prctl, so the parent-death signal waits for sigwait instead of being lost.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        set_parent_death_signal(signal.SIGUSR1)
        if os.getppid() == rank_pid:
            signal.sigwait({signal.SIGUSR1})
        os.killpg(os.getpgid(0), signal.SIGKILL)
    finally:
        os._exit(0)


def _extend_sys_path() -> None:
    """See the launcher's modules (a fresh interpreter does not inherit its sys.path edits)."""
    for entry in json.loads(os.environ.get(SYS_PATH_VARIABLE, "[]")):
        if entry not in sys.path:
            sys.path.append(entry)


def resolve_target(target: str) -> Any:
    """The function "module:function" names (the module imported here: a rank's first import of
    torch, usually, done with the garbage collector paused, see clorch._gc)."""
    module_name, name = target.split(":")
    module = import_long_lived(module_name)
    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"main {target!r}: module {module_name!r} has no attribute {name!r}") from None


def _write_error(log_dir: Path, rank: int, exc: BaseException) -> None:
    code = exc.code if isinstance(exc, SystemExit) else None
    message = f"sys.exit({code!r})" if isinstance(exc, SystemExit) else str(exc)
    write_json_atomic(
        log_dir / f"rank_{rank}.error.json",
        {
            "rank": rank,
            "pid": os.getpid(),
            "timestamp": time.time(),
            "type": type(exc).__name__,
            "module": type(exc).__module__,
            "message": message,
            "traceback": "".join(traceback.format_exception(exc)),
        },
    )


def _write_result(log_dir: Path, rank: int, result: Any) -> None:
    try:
        write_json_atomic(log_dir / f"rank_{rank}.result.json", result, allow_nan=False)
    except (TypeError, ValueError) as exc:
        print(
            f"clorch: rank {rank}: main returned a value that is not JSON-serializable "
            f"({type(result).__name__}: {exc}); it is not stored",
            file=sys.stderr,
        )


# How a rank joins its process group: clorch.distributed's lifecycle (device binding, timeouts,
# a restarted job's fresh store). Named, not imported: clorch.distributed sits above the launcher
# (it re-exports `launch`), so the launcher reaches it only inside the rank, by this name.
GROUP_OPENER = "clorch.distributed.groups:process_group"


def _close_store_socket() -> None:
    """Close the listening socket the launcher handed rank 0 for a clorch group (see groups.py).

    Called in the rank's sentinel, and in a rank launched without a backend: one
    that makes its own group (torch's `init_process_group` binds MASTER_PORT
    itself) would otherwise find the port taken by its own socket.
    """
    fd = os.environ.pop(STORE_FD_VARIABLE, None)
    if fd is not None:
        with contextlib.suppress(OSError, ValueError):
            os.close(int(fd))


def _call(fn: Any, backend: str, args: Any) -> Any:
    ctx = {
        "rank": int(os.environ["RANK"]),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "world_size": int(os.environ["WORLD_SIZE"]),
        "backend": None,
        "process_group": None,
        "args": args,
    }
    if backend == "none":
        _close_store_socket()
        return fn(ctx)
    # lazy: a rank started without a backend never imports torch
    import torch.distributed as dist

    with resolve_target(GROUP_OPENER)(backend=backend):
        ctx["backend"] = str(dist.get_backend())
        ctx["process_group"] = dist.group.WORLD
        return fn(ctx)


def run(target: str, log_dir: Path, backend: str) -> None:
    """Resolve and call `target` as this rank; write its result or its error file."""
    rank = int(os.environ["RANK"])
    try:
        fn = resolve_target(target)
        args = json.loads((log_dir / "args.json").read_text())
        _write_result(log_dir, rank, _call(fn, backend, args))
    except SystemExit as exc:
        if exc.code not in (None, 0):
            _write_error(log_dir, rank, exc)
        raise
    except BaseException as exc:
        _write_error(log_dir, rank, exc)
        raise


def exit_without_finalizing(code: int) -> None:
    """Run atexit handlers and flush, then leave without interpreter finalization.

    The rank's work is done and reported (result or error file written, group
    destroyed). Finalization is skipped because torch's gloo threads have been
    seen to abort there ("terminate called without an active exception",
    SIGABRT) once in a few hundred runs, which turned a finished rank into a
    failed job. User atexit handlers (logging's flush among them) still run.
    """
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)  # sys.exit("message") prints it and exits 1, as Python does
    return 1


_sigint_received: list[bool] = []


def _on_sigint(signum: int, frame: Any) -> None:
    """Python's own SIGINT behaviour (KeyboardInterrupt), remembering that it came."""
    _sigint_received.append(True)
    raise KeyboardInterrupt


def _end_interrupted() -> None:
    """The launcher forwarded a Ctrl-C: one line instead of a traceback (the error file keeps
    it), then end by SIGINT, which the status reports by name. A peer's "connection reset"
    raised meanwhile is part of the same stop and is not printed either."""
    print(f"clorch: rank {os.environ.get('RANK')} interrupted (SIGINT)", file=sys.stderr, flush=True)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


def _keep_store_socket_here() -> None:
    """The store's socket (rank 0's) is not passed on to programs the rank starts (os.system,
    close_fds=False), which would keep the port after the rank's store has closed."""
    fd = os.environ.get(STORE_FD_VARIABLE)
    if fd is not None:
        with contextlib.suppress(OSError, ValueError):
            os.set_inheritable(int(fd), False)


def main(argv: list[str]) -> None:
    options = dict(zip(argv[::2], argv[1::2]))
    _keep_store_socket_here()
    _guard_parent()
    _start_sentinel()
    _extend_sys_path()
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)
    try:
        run(options["--main"], Path(options["--log-dir"]), options["--backend"])
    except SystemExit as exc:
        exit_without_finalizing(_exit_code(exc))
    except KeyboardInterrupt:
        _end_interrupted()
    except BaseException:
        if _sigint_received:
            _end_interrupted()
        traceback.print_exc()  # what Python would print; the error file has it too
        exit_without_finalizing(1)
    exit_without_finalizing(0)


if __name__ == "__main__":
    main(sys.argv[1:])
