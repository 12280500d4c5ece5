"""The nodes of a multi-node `launch()` meet before any rank starts.

With `nnodes > 1`, each node's launcher calls `meet_nodes` before every start
of its ranks. Node 0's launcher listens on master_addr:master_port; the others
connect there and say which node they are. When all `nnodes` have arrived,
node 0 answers every one "go", closes the port (rank 0 binds it next for the
ranks' own store) and every launcher starts its ranks. When they do not all
arrive within `timeout` seconds, every launcher that is waiting ends with a
`RendezvousTimeout` that names the endpoint, the nodes that joined and the
timeout, instead of ranks waiting in their process group's own, much longer,
timeout.

Which processes call it: the launcher of every node, once per start of the
ranks (restarts meet again). It blocks until all nodes have arrived or the
timeout passes. The exchange is one line of text each way over TCP; it
carries no secret and opens no other port.
"""

from __future__ import annotations

import socket
import time
from typing import Callable

_GREETING = "clorch-nodes"
_RETRY_S = 0.2


class RendezvousTimeout(RuntimeError):
    """The nodes of a job did not all arrive in time, or disagree about the job's layout."""


class RendezvousStopped(RuntimeError):
    """The job was stopped while its launcher waited for the other nodes."""


def _endpoint(addr: str, port: int) -> str:
    return f"{addr}:{port}"


def _joined_text(joined: list[int], nnodes: int) -> str:
    names = ", ".join(str(n) for n in sorted(joined)) or "none"
    return f"node(s) {names} joined ({len(joined)} of {nnodes})"


def meet_nodes(
    addr: str, port: int, nnodes: int, node_rank: int, timeout: float, stopped: Callable[[], bool] = lambda: False
) -> None:
    """Block until the launchers of all `nnodes` nodes have met at addr:port.

    `stopped` is asked about once a second; when it says True the wait ends.

    Raises:
        RendezvousTimeout: not every node arrived within `timeout` seconds, a
            node gave another `nnodes`, or two nodes gave the same node_rank.
        RendezvousStopped: `stopped()` said True.
    """
    deadline = time.monotonic() + timeout
    if node_rank == 0:
        _host(addr, port, nnodes, timeout, deadline, stopped)
    else:
        _join(addr, port, nnodes, node_rank, timeout, deadline, stopped)


def _listen(addr: str, port: int) -> socket.socket:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        # Every interface: master_addr names this machine as the others reach it,
        # which may not be an address a socket here can bind.
        server.bind(("", port))
    except OSError as exc:
        server.close()
        raise RendezvousTimeout(
            f"node 0 cannot listen on port {port} (master_port) for the other nodes: {exc}"
        ) from None
    server.listen(64)
    return server


def _host(addr: str, port: int, nnodes: int, timeout: float, deadline: float, stopped: Callable[[], bool]) -> None:
    server = _listen(addr, port)
    waiting: dict[int, socket.socket] = {}
    try:
        while len(waiting) < nnodes - 1:
            if stopped():
                _answer_all(waiting, "fail node 0's job was stopped while the nodes met")
                raise RendezvousStopped("stopped while waiting for the other nodes")
            left = deadline - time.monotonic()
            if left <= 0:
                message = (
                    f"the nodes did not meet at {_endpoint(addr, port)} (master_addr:master_port) "
                    f"within {timeout:g} s (rdzv_timeout): {_joined_text([0, *waiting], nnodes)}"
                )
                _answer_all(waiting, f"fail {message}")
                raise RendezvousTimeout(message)
            server.settimeout(min(left, 1.0))
            try:
                conn, _ = server.accept()
            except (socket.timeout, TimeoutError):
                continue
            _admit(conn, nnodes, waiting)
        _answer_all(waiting, "go")
    finally:
        for conn in waiting.values():
            conn.close()
        server.close()


def _admit(conn: socket.socket, nnodes: int, waiting: dict[int, socket.socket]) -> None:
    """Read a joining node's greeting; keep its connection, or refuse it with the reason."""
    try:
        words = _await_answer(conn, time.monotonic() + 5.0, lambda: False).split()
    except OSError:
        conn.close()
        return
    if len(words) != 3 or words[0] != _GREETING or not all(w.isdigit() for w in words[1:]):
        conn.close()  # not a clorch launcher: ignore it
        return
    their_nnodes, their_rank = int(words[1]), int(words[2])
    problem = None
    if their_nnodes != nnodes:
        problem = f"node {their_rank} was started with nnodes={their_nnodes}, node 0 with nnodes={nnodes}"
    elif their_rank in waiting or not 0 < their_rank < nnodes:
        problem = f"node_rank={their_rank} is already taken or not in [1, {nnodes})"
    if problem is not None:
        _send(conn, f"fail {problem}")
        conn.close()
        return
    waiting[their_rank] = conn


def _answer_all(waiting: dict[int, socket.socket], line: str) -> None:
    for conn in waiting.values():
        try:
            _send(conn, line)
        except OSError:
            pass


def _join(
    addr: str, port: int, nnodes: int, node_rank: int, timeout: float, deadline: float, stopped: Callable[[], bool]
) -> None:
    where = _endpoint(addr, port)
    while True:
        conn = _connect(addr, port, deadline, stopped)
        if conn is None:
            raise RendezvousTimeout(
                f"the nodes did not meet at {where} (master_addr:master_port) within {timeout:g} s "
                f"(rdzv_timeout): node 0 never answered there; node {node_rank} waited"
            )
        try:
            _send(conn, f"{_GREETING} {nnodes} {node_rank}")
            # Node 0 answers by its deadline; a second more covers the clocks' difference.
            answer = _await_answer(conn, deadline + 1.0, stopped)
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise RendezvousTimeout(
                    f"the nodes did not meet at {where}: node 0 did not answer node "
                    f"{node_rank} within {timeout:g} s (rdzv_timeout): {exc}"
                ) from None
            answer = ""  # reset by whatever holds the port for now: ask again below
        finally:
            conn.close()
        if answer == "go":
            return
        if answer.startswith("fail "):
            raise RendezvousTimeout(answer[len("fail ") :])
        # Closed without a clorch answer: something else holds the port for now, such as node 0's
        # ranks' store while that node has not yet noticed this one's restart. Ask again.
        time.sleep(_RETRY_S)


def _await_answer(conn: socket.socket, deadline: float, stopped: Callable[[], bool]) -> str:
    """The peer's one line (node 0's answer, a joining node's greeting); raises socket.timeout
    at the deadline. Stops reading after 64 KiB: no line of this exchange is that long."""
    data = b""
    while not data.endswith(b"\n"):
        if stopped():
            raise RendezvousStopped("stopped while waiting for the other nodes")
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("no answer")
        conn.settimeout(min(left, 1.0))
        try:
            chunk = conn.recv(4096)
        except (socket.timeout, TimeoutError):
            continue
        if not chunk:
            break  # the peer closed without a line
        data += chunk
        if len(data) > 65536:
            break
    return data.decode(errors="replace").strip()


def _connect(addr: str, port: int, deadline: float, stopped: Callable[[], bool]) -> socket.socket | None:
    """A connection to node 0, retried until the deadline (node 0 may start later)."""
    while time.monotonic() < deadline:
        if stopped():
            raise RendezvousStopped("stopped while waiting for the other nodes")
        try:
            return socket.create_connection((addr, port), timeout=max(0.1, deadline - time.monotonic()))
        except OSError:
            time.sleep(_RETRY_S)
    return None


def _send(conn: socket.socket, line: str) -> None:
    conn.sendall((line + "\n").encode())
