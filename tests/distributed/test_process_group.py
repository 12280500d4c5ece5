"""Process-group lifecycle and environment checks."""

from __future__ import annotations

import os
import socket

import pytest
import torch

import clorch.distributed as cd
from clorch.env import read_env
from tests.harness import run_ranks

pytestmark = pytest.mark.timeout(120)

BASE = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_missing_variable_is_named():
    env = dict(BASE)
    del env["MASTER_PORT"]
    with pytest.raises(ValueError, match="missing environment variable.*MASTER_PORT"):
        read_env(env)


def test_bad_variables_are_named():
    with pytest.raises(ValueError, match=r"RANK must be in \[0, 2\), got 2"):
        read_env({**BASE, "RANK": "2"})
    with pytest.raises(ValueError, match="WORLD_SIZE must be an integer, got 'two'"):
        read_env({**BASE, "WORLD_SIZE": "two"})
    with pytest.raises(ValueError, match=r"LOCAL_RANK must be in \[0, 1\)"):
        read_env({**BASE, "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "1"})


def test_local_defaults_follow_global_values():
    env = read_env({**BASE, "RANK": "1"})
    assert (env.local_rank, env.local_world_size, env.master_port) == (1, 2, 29500)


def test_unknown_backend_lists_allowed_ones():
    with pytest.raises(ValueError, match="backend must be one of auto, nccl, gloo, got 'mpi'"):
        cd.init_process_group(backend="mpi")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_nccl_without_cuda_says_what_to_do():
    with pytest.raises(ValueError, match="needs CUDA.*use backend='gloo'"):
        cd.init_process_group(backend="nccl")


def test_missing_environment_is_reported_by_init(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT"):
        cd.init_process_group(backend="gloo")
    assert not cd.is_initialized()


def _wait_until_all_left(meeting: str, rank: int, world_size: int) -> None:
    """Meet outside any group: each rank notes that it left the first group and waits for the others
    (else a fast rank could reach the old store, still open on the same port, before it closes)."""
    import time
    from pathlib import Path

    Path(meeting, f"left_{rank}").touch()
    deadline = time.monotonic() + 30
    while not all(Path(meeting, f"left_{r}").exists() for r in range(world_size)):
        if time.monotonic() > deadline:
            raise TimeoutError("the other ranks did not leave the first group within 30 s")
        time.sleep(0.01)


def _lifecycle(rank: int, world_size: int, meeting: str) -> dict:
    seen = {}
    try:
        with cd.process_group(backend="gloo", timeout=30):
            seen["inside"] = cd.is_initialized()
            try:
                cd.init_process_group(backend="gloo")
            except RuntimeError as exc:
                seen["twice"] = str(exc)
            raise KeyError("body failed")
    except KeyError:
        seen["after_error"] = cd.is_initialized()
    _wait_until_all_left(meeting, rank, world_size)
    cd.init_process_group(backend="auto", timeout=30)  # again, on the same port: the group was freed
    seen["auto"] = cd.backend()
    cd.all_reduce(torch.ones(2))
    cd.destroy_process_group()
    seen["destroyed"] = cd.is_initialized()
    return seen


def test_lifecycle_destroys_on_error_and_refuses_double_init(tmp_path):
    for seen in run_ranks(_lifecycle, 2, str(tmp_path), init_group=False):
        assert seen["inside"] is True
        assert "already initialized" in seen["twice"]
        assert seen["after_error"] is False
        assert seen["auto"] == "gloo"
        assert seen["destroyed"] is False


def test_only_a_socket_listening_on_master_port_is_taken_from_the_launcher(monkeypatch):
    from clorch.distributed.groups import _handed_socket
    from clorch.env import STORE_FD_VARIABLE
    from clorch.launch.procs import listen_on_free_port

    read, write = os.pipe()
    with listen_on_free_port() as listening, socket.socket() as idle:
        port = listening.getsockname()[1]
        for fd, expected in ((listening.fileno(), listening.fileno()), (idle.fileno(), None), (read, None)):
            monkeypatch.setenv(STORE_FD_VARIABLE, str(fd))
            assert _handed_socket(port) == expected
            assert STORE_FD_VARIABLE not in os.environ, "used once"
        monkeypatch.setenv(STORE_FD_VARIABLE, str(listening.fileno()))
        assert _handed_socket(port + 1) is None, "a socket on another port"
    os.close(read)
    os.close(write)
