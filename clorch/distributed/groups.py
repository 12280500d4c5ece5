"""Process-group lifecycle: initialize from the environment, bind the device, tear down.

Outside an initialized group every query answers as rank 0 of a world of 1
(`rank() == 0`, `world_size() == 1`, `backend() is None`), so single-process
code can call them unconditionally.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import socket
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.distributed as dist

from clorch.distributed.exit_guard import watch_process_group
from clorch.env import COLLECTIVE_TIMEOUT_VARIABLE, STORE_FD_VARIABLE, DistEnv, read_env, restart_count

BACKENDS = ("auto", "nccl", "gloo")
DEFAULT_TIMEOUT_S = 600.0  # torch's own default for NCCL; a hung rank is found within 10 minutes
DEBUG_VARIABLE = "CLORCH_DEBUG_COLLECTIVES"
# Seconds a rank tries to reach a store that torch's elastic agent hosts (see _rendezvous_store).
AGENT_STORE_CONNECT_S = 10.0


@dataclass
class _GroupState:
    env: DistEnv
    backend: str
    device: torch.device
    debug: bool
    group: object  # the default process group clorch made: torch may replace it behind our back


_state: _GroupState | None = None


def _default_group_reader() -> Callable[[], object]:
    """A function returning torch's default process group (None when there is none).

    torch keeps it in `_world._default_pg`; reading that attribute skips the ~0.1 us of the
    public `dist.group.WORLD` property, which counts on the collectives' fast path.
    Any other torch layout gets the public property.
    """
    world = getattr(dist.distributed_c10d, "_world", None) if dist.is_available() else None
    if world is not None and "_default_pg" in vars(world):
        return lambda: world._default_pg
    return lambda: dist.group.WORLD


_default_group = _default_group_reader()


def _live_state() -> _GroupState | None:
    """What clorch recorded at init about the default group, or None.

    None outside a clorch-made group, and also when the group was destroyed (and
    perhaps made again) with torch.distributed directly: clorch's record then
    describes a group that is gone, so every query falls back to asking torch.
    """
    state = _state
    if state is not None and state.group is not _default_group():
        return None
    return state


def resolve_backend(backend: str) -> str:
    """Turn "auto" into "nccl" (CUDA available) or "gloo"; check explicit names.

    Raises:
        ValueError: unknown backend, or "nccl" on a machine without CUDA.
    """
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError(
            "backend 'nccl' needs CUDA, but torch.cuda.is_available() is False on this machine: "
            "use backend='gloo' (CPU) or backend='auto'"
        )
    return backend


def _timeout(timeout: float | _dt.timedelta | None) -> _dt.timedelta:
    if timeout is None:
        # clorch's launcher passes its collective_timeout to the ranks this way.
        text = os.environ.get(COLLECTIVE_TIMEOUT_VARIABLE)
        try:
            return _dt.timedelta(seconds=float(text) if text else DEFAULT_TIMEOUT_S)
        except ValueError:
            raise ValueError(f"{COLLECTIVE_TIMEOUT_VARIABLE} must be seconds, got {text!r}") from None
    if isinstance(timeout, _dt.timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise TypeError(f"timeout must be seconds (a number) or a timedelta, got {timeout!r}")
    if seconds <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {seconds}")
    return _dt.timedelta(seconds=seconds)


def _debug_enabled(debug: bool | None) -> bool:
    if debug is not None:
        return bool(debug)
    return os.environ.get(DEBUG_VARIABLE, "0").lower() not in ("", "0", "false", "no")


def _local_cuda_index(env: DistEnv) -> int:
    """The device index this rank drives: 0 when the launcher masked the others."""
    count = torch.cuda.device_count()
    if count == 1:
        return 0
    if env.local_rank >= count:
        raise ValueError(
            f"LOCAL_RANK {env.local_rank} has no CUDA device: {count} visible, "
            f"LOCAL_WORLD_SIZE {env.local_world_size}; nccl needs one distinct device per local rank"
        )
    return env.local_rank


def _check_distinct_devices(env: DistEnv, index: int) -> None:
    """Every local rank must drive its own GPU; two on one device would hang NCCL.

    All ranks publish (host, device uuid) to the rendezvous store, then each
    compares its own with its node's peers. Collective: every rank calls it.
    """
    store = dist.distributed_c10d._get_default_store()
    host = socket.gethostname()
    uuid = str(torch.cuda.get_device_properties(index).uuid)
    store.set(f"clorch/device/{env.rank}", f"{host}|{uuid}")
    claims = [store.get(f"clorch/device/{r}").decode() for r in range(env.world_size)]
    # Rank 0 hosts the store: it must not tear it down (on the error below) before every rank
    # has read the claims, or the others fail with "connection reset" instead of this message.
    store.add("clorch/device/read", 1)
    if env.rank == 0:
        deadline = time.monotonic() + 60.0
        while store.add("clorch/device/read", 0) < env.world_size and time.monotonic() < deadline:
            time.sleep(0.005)
    owners = [r for r, claim in enumerate(claims) if claim == f"{host}|{uuid}"]
    if len(owners) > 1:
        raise ValueError(
            f"ranks {owners} on host {host} share CUDA device {uuid}: nccl needs one distinct "
            "device per local rank (set CUDA_VISIBLE_DEVICES per rank, or launch fewer ranks)"
        )


def _rendezvous_store(env: DistEnv, timeout: _dt.timedelta) -> dist.Store:
    """The store the ranks meet in at MASTER_ADDR:MASTER_PORT.

    Rank 0 hosts it (a new one each start), unless torch's elastic agent already
    does (TORCHELASTIC_USE_AGENT_STORE=True). The agent's store outlives a restart,
    and a restarted rank that read the previous start's keys (a peer's old address)
    would fail to connect; so there the keys go under a prefix holding the restart
    count (TORCHELASTIC_RESTART_COUNT). A failure restarts every node's ranks, and
    every agent counts it; a restart that only admits a new node into an elastic
    range (nnodes=MIN:MAX) does not raise the healthy nodes' count, and such a
    start may then wait for its collective timeout before restarting again.

    Where clorch's launcher chose the port, it hands rank 0 a socket already
    listening on it (CLORCH_STORE_FD), so that no other process can take the
    port between the launcher's choice and rank 0's start (`_handed_socket`).
    """
    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if agent_hosts:
        store = _agent_store(env, timeout)
        return dist.PrefixStore(f"clorch/start_{restart_count()}", store)
    hosts = env.rank == 0
    listen_fd = _handed_socket(env.master_port) if hosts else None
    return dist.TCPStore(
        env.master_addr,
        env.master_port,
        env.world_size,
        is_master=hosts,
        timeout=timeout,
        multi_tenant=True,
        master_listen_fd=listen_fd,
    )


def _agent_store(env: DistEnv, timeout: _dt.timedelta) -> dist.Store:
    """A connection to the store torch's agent of group rank 0 hosts, with `timeout` for its calls.

    That store listens before the agent starts any rank, so one that cannot be reached has
    gone with its node (lost while this rank started). The connection is given up after
    AGENT_STORE_CONNECT_S rather than retried for the collective timeout: the other nodes'
    agents watch their own ranks alone, and would wait that long for this rank to end.
    """
    connect = min(timeout, _dt.timedelta(seconds=AGENT_STORE_CONNECT_S))
    try:
        store = dist.TCPStore(
            env.master_addr, env.master_port, env.world_size, is_master=False, timeout=connect, multi_tenant=True
        )
    except dist.DistNetworkError as exc:
        raise RuntimeError(
            f"the job's store at {env.master_addr}:{env.master_port}, hosted by torchrun's agent on the node "
            f"of rank 0, gave no connection within {connect.total_seconds():g} s (connection refused or no "
            "answer): that node has gone"
        ) from exc
    store.set_timeout(timeout)
    return store


def _handed_socket(port: int) -> int | None:
    """The descriptor of the socket clorch's launcher handed this rank, if it is one listening on `port`.

    Used once: the store closes it when it ends, and a later group in the same
    process binds MASTER_PORT itself (once the earlier group's store is freed).
    A descriptor that is not such a socket (the variable inherited by a program
    started from rank 0) is ignored.
    """
    value = os.environ.pop(STORE_FD_VARIABLE, None)
    if value is None:
        return None
    try:
        fd = int(value)
        with socket.socket(fileno=os.dup(fd)) as sock:
            listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
            ours = listening and sock.getsockname()[1] == port
    except (OSError, ValueError):
        return None
    return fd if ours else None


def init_process_group(
    backend: str = "auto",
    timeout: float | _dt.timedelta | None = None,
    debug: bool | None = None,
) -> None:
    """Join the job described by the environment variables.

    Every rank of the job must call it; it blocks until all WORLD_SIZE ranks
    have met at MASTER_ADDR:MASTER_PORT (or `timeout` passes) and, under gloo,
    have all finished connecting to each other.

    Args:
        backend: "auto" (nccl with CUDA, gloo without), "nccl" or "gloo".
        timeout: seconds (or a timedelta) for rendezvous and each collective;
            None: CLORCH_COLLECTIVE_TIMEOUT (set by clorch's launcher), else 600.
        debug: check collective fingerprints across ranks before each call;
            None reads CLORCH_DEBUG_COLLECTIVES.

    Raises:
        RuntimeError: a group is already initialized.
        ValueError: a missing or bad environment variable, a bad backend, or
            two local ranks on one CUDA device.
    """
    global _state
    if is_initialized():
        raise RuntimeError(
            "a process group is already initialized in this process; call "
            "destroy_process_group() first (process_group() does it on exit)"
        )
    name = resolve_backend(backend)
    env = read_env()
    delta = _timeout(timeout)
    debug_on = _debug_enabled(debug)
    dist.init_process_group(
        name, store=_rendezvous_store(env, delta), rank=env.rank, world_size=env.world_size, timeout=delta
    )
    device = torch.device("cpu")
    try:
        if name == "gloo":
            # gloo connects every pair of ranks at init, and one rank's init may return before its
            # peer has finished the handshake: a rank that then left at once (a group used only for
            # its rank and size) closed the pair under the peer ("connectFullMesh failed ...
            # Connection closed by peer"). No rank leaves init before every rank has joined.
            dist.barrier()
        if name == "nccl":
            index = _local_cuda_index(env)
            _check_distinct_devices(env, index)
            torch.cuda.set_device(index)
            device = torch.device("cuda", index)
    except BaseException:
        dist.destroy_process_group()
        raise
    _state = _GroupState(env=env, backend=name, device=device, debug=debug_on, group=_default_group())
    watch_process_group()


def destroy_process_group() -> None:
    """Leave the group. A no-op when none is initialized."""
    global _state
    _state = None
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def process_group(
    backend: str = "auto",
    timeout: float | _dt.timedelta | None = None,
    debug: bool | None = None,
) -> Iterator[None]:
    """Initialize the group for the with-block and destroy it on exit, also on error.

    Same arguments and errors as `init_process_group`.
    """
    init_process_group(backend=backend, timeout=timeout, debug=debug)
    try:
        yield
    finally:
        destroy_process_group()


def is_initialized() -> bool:
    """True inside an initialized process group (clorch's or one made by torch directly)."""
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process's global rank; 0 outside a group."""
    return dist.get_rank() if is_initialized() else 0


def world_size() -> int:
    """Number of ranks in the job; 1 outside a group."""
    return dist.get_world_size() if is_initialized() else 1


def check_group_joined(caller: str) -> None:
    """Refuse to go on as a world of 1 in a process that a launcher started as one of several ranks.

    Outside a group clorch answers as rank 0 of a world of 1, which is right for a
    plain `python train.py`. Under torchrun, clorch's launcher or a SLURM script
    WORLD_SIZE says how many ranks the job has: if such a process never joined the
    group, every rank would train alone and nothing would say so. torch's DDP
    raises there too (no default process group).

    Local (no collective). Reads WORLD_SIZE only when no group is initialized.

    Args:
        caller: what is being built, for the message (e.g. "DistributedDataParallel").

    Raises:
        RuntimeError: no process group is initialized and WORLD_SIZE is an integer > 1.
    """
    if is_initialized():
        return
    text = os.environ.get("WORLD_SIZE", "")
    try:
        size = int(text)
    except ValueError:
        return  # unset or malformed: init_process_group reports a malformed value when called
    if size > 1:
        raise RuntimeError(
            f"{caller}: the environment says this process is one of WORLD_SIZE={size} ranks, but no "
            "process group is initialized, so it would train alone as a world of 1. Join the job "
            "first: wrap the training in `with clorch.distributed.process_group():` or call "
            "`clorch.distributed.init_process_group()` (torch.distributed.init_process_group works "
            "too); to run a single process on purpose, unset WORLD_SIZE"
        )


def local_rank() -> int:
    """Rank within this node; 0 outside a group."""
    state = _live_state()
    if state is not None:
        return state.env.local_rank
    return int(os.environ.get("LOCAL_RANK", 0)) if is_initialized() else 0


def local_world_size() -> int:
    """Ranks on this node; 1 outside a group."""
    state = _live_state()
    if state is not None:
        return state.env.local_world_size
    return int(os.environ.get("LOCAL_WORLD_SIZE", world_size())) if is_initialized() else 1


def backend() -> str | None:
    """ "nccl" or "gloo" inside a group, None outside."""
    state = _live_state()
    if state is not None:
        return state.backend  # known since init: no look-up on the collectives' path
    return str(dist.get_backend()) if is_initialized() else None


def device() -> torch.device:
    """The device collectives run on: this rank's GPU for nccl, else the CPU.

    For a group made by `torch.distributed.init_process_group` (as torchrun
    scripts do) with nccl, that is the current CUDA device: call
    `torch.cuda.set_device(local_rank)` first, as with torch.
    """
    state = _live_state()
    if state is not None:
        return state.device
    if is_initialized() and "nccl" in str(dist.get_backend()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def debug_enabled() -> bool:
    """Whether collectives exchange fingerprints before running.

    For a group made by torch directly, CLORCH_DEBUG_COLLECTIVES decides.
    """
    state = _live_state()
    if state is not None:
        return state.debug
    return is_initialized() and _debug_enabled(None)


get_rank = rank
get_world_size = world_size
