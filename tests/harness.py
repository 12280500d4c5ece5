"""Multi-process test harness: N real ranks (gloo on the CPU), one process each.

`run_ranks(fn, world_size, *args)` starts `world_size` processes, gives them
the standard environment variables and a free port, runs `fn(rank,
world_size, *args)` inside `clorch.distributed.process_group()` and returns
the per-rank return values.

* Each rank is forked from a server process (multiprocessing's forkserver)
  that imported torch (and with it numpy; Hydra and OmegaConf too) before any test state existed, so
  torch's import (2-3 s of CPU) is paid once per test session instead of once
  per rank. The rank's environment is the caller's at the call, then the
  standard variables, then `env`; its working directory is the caller's.
  What torch read from the environment at import time is the server's: pass
  such variables to a spawned subprocess instead. The server's stdout and
  stderr are pytest's at the first call, so `capfd` does not see ranks' output.
* A timeout bounds the whole run; on expiry every rank is killed and the
  failure shows each rank's Python stacks (faulthandler) at that moment.
* When one rank raises, the others get a few seconds to finish, then are
  killed; the failure shows every rank's traceback.
* Nothing is left running: every child is joined or killed before returning;
  the server ends with the test session.

`fn` must be a module-level function (it is pickled by name).
"""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import pickle
import random
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable


# Ports handed out by `free_port` in this test session, never handed out twice.
_given_ports: set[int] = set()


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port that is free now, below the kernel's ephemeral range, not handed out before.

    A port the kernel chose with bind(0) comes from the ephemeral range, which
    every outgoing connection (gloo opens many) draws from too: between the
    test's choice and rank 0's bind, a connection could take it. Below that
    range only an explicit bind can.
    """
    low = _ephemeral_low()
    candidates = list(range(max(1024, low - 12000), low))
    random.shuffle(candidates)
    for port in candidates:
        if port in _given_ports:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given_ports.add(port)
        return port
    raise RuntimeError("no free TCP port below the ephemeral range")


class RankFailure(AssertionError):
    """One or more ranks failed; the message holds every rank's report."""


def _context() -> mp.context.BaseContext:
    """Where ranks start: the forkserver, with torch imported there before the first fork."""
    ctx = mp.get_context("forkserver")
    # torch, and Hydra and OmegaConf for the clorch-train processes of tests.clirunner (a few
    # tenths of a second each); not clorch, which may read the environment on import.
    ctx.set_forkserver_preload(["torch", "omegaconf", "hydra"])
    return ctx


def take_callers_state(env: dict[str, str], cwd: str) -> None:
    """In a process forked from the server: the caller's environment and directory, not the server's."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)


def _rank_main(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    workdir: str,
    env: dict[str, str],
    args: tuple,
    timeout: float,
    init_group: bool,
    backend: str,
    caller_env: dict[str, str],
    cwd: str,
) -> None:
    take_callers_state(caller_env, cwd)
    os.environ.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
    )
    os.environ.update(env)
    stacks = open(Path(workdir) / f"stacks_{rank}.txt", "w")
    faulthandler.dump_traceback_later(max(timeout - 2, 1), exit=False, file=stacks)
    out = Path(workdir) / f"result_{rank}.pkl"
    try:
        import torch

        torch.set_num_threads(1)
        if init_group:
            from clorch.distributed import process_group

            with process_group(backend=backend, timeout=max(timeout, 5)):
                result = fn(rank, world_size, *args)
        else:
            result = fn(rank, world_size, *args)
        out.write_bytes(pickle.dumps(("ok", result)))
    except BaseException as exc:  # report everything, including SystemExit
        report = "".join(traceback.format_exception(exc))
        out.write_bytes(pickle.dumps(("error", report)))
        raise SystemExit(1)
    # The result is written and the group destroyed. Skip interpreter finalization: once in a
    # few hundred runs torch's gloo threads aborted there ("terminate called without an active
    # exception"), turning a rank that had finished and passed into a failed test.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _reports(workdir: Path, world_size: int, exitcodes: list[int | None]) -> str:
    parts = []
    for rank in range(world_size):
        result = workdir / f"result_{rank}.pkl"
        stacks = workdir / f"stacks_{rank}.txt"
        text = f"--- rank {rank} (exit code {exitcodes[rank]}) ---\n"
        if result.exists():
            status, payload = pickle.loads(result.read_bytes())
            text += payload if status == "error" else "returned normally\n"
        elif stacks.exists() and stacks.read_text():
            text += "no result; stacks at timeout:\n" + stacks.read_text()
        else:
            text += "no result (killed or crashed)\n"
        parts.append(text)
    return "\n".join(parts)


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
    init_group: bool = True,
    grace: float = 5.0,
    backend: str = "gloo",
) -> list[Any]:
    """Run `fn(rank, world_size, *args)` on `world_size` ranks; return each rank's result.

    `backend` is "gloo" (CPU, the default) or "nccl" (the `cuda` tier).

    Raises:
        RankFailure: a rank raised, crashed or the run timed out (message: every rank's report).
    """
    ctx = _context()
    port = free_port()
    caller_env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="clorch-ranks-") as tmp:
        workdir = Path(tmp)
        procs = [
            ctx.Process(
                target=_rank_main,
                daemon=True,
                args=(
                    fn,
                    r,
                    world_size,
                    port,
                    tmp,
                    env or {},
                    args,
                    timeout,
                    init_group,
                    backend,
                    caller_env,
                    os.getcwd(),
                ),
            )
            for r in range(world_size)
        ]
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + timeout
        failed_at: float | None = None
        timed_out = False
        while any(p.is_alive() for p in procs):
            now = time.monotonic()
            if failed_at is None and any(p.exitcode not in (None, 0) for p in procs):
                failed_at = now
            if now > deadline or (failed_at is not None and now > failed_at + grace):
                timed_out = now > deadline
                break
            time.sleep(0.02)
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(10)
        codes = [p.exitcode for p in procs]
        if timed_out or any(code != 0 for code in codes):
            reason = f"timed out after {timeout}s" if timed_out else "a rank failed"
            raise RankFailure(f"{reason}\n{_reports(workdir, world_size, codes)}")
        return [pickle.loads((workdir / f"result_{r}.pkl").read_bytes())[1] for r in range(world_size)]


def processes_holding(path: Path) -> list[int]:
    """The pids of the processes that hold `path` open (this test's own process aside): a trial's
    rank holds its metrics.jsonl from its first step on, wherever it runs."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if str(path) in [os.readlink(fd) for fd in (proc / "fd").iterdir()]:
                pids.append(int(proc.name))
        except OSError:  # it ended, or one of its files closed, while we looked
            continue
    return pids
