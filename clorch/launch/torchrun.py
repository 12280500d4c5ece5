"""`launcher=torchrun`: run torch's elastic agent on this node, from Python.

The agent (`torch.distributed.launcher.api`, what the `torchrun` command runs)
meets the other nodes at `rdzv_endpoint` (c10d rendezvous), starts
`nproc_per_node` ranks here, restarts them all up to `max_restarts` times when
one fails (they resume from the latest checkpoint), and ends every node's ranks
when one fails for good. Each rank runs `python -m clorch.engine.as_rank` on the
checked config the launching process wrote into the run directory.

Each rank writes its stdout and stderr to the run directory's `logs/`, as under
clorch's own launcher (`rank_<global rank>.stdout`, `.stderr`; a restart's
files are `rank_<r>.restart_<n>.stdout`, ...; torch's error file beside them),
and the agent copies them to the console, each line prefixed `[rank<r>]:`.
The ranks never write to the console themselves: a console that goes away (a
closed pipe) cannot end them (see clorch.launch.console).

Failure modes, each ending with a `TorchrunError` whose message says what happened:
the other nodes never arrive within `rdzv_timeout` seconds (the endpoint, the
node count expected and the timeout are named), or a rank fails (its global
rank, exit code and error file, if torch recorded one).
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import threading
from base64 import b64decode
from datetime import timedelta
from pathlib import Path
from typing import Any

from clorch.env import (  # noqa: F401 (quiet_cpp_warnings, ranks_environ: re-exported)
    CPP_LOG_VARIABLE,
    cpp_warnings_quieted,
    quiet_cpp_warnings,
    ranks_environ,
    with_multicast_off,
)


class TorchrunError(RuntimeError):
    """The elastic agent ended the job: no rendezvous, or a rank failed."""


def _node_range(nnodes: int | str) -> tuple[int, int]:
    parts = str(nnodes).split(":")
    return int(parts[0]), int(parts[-1])


def _describe_failure(exc: BaseException) -> str:
    failures = getattr(exc, "failures", None) or {}
    shown = []
    for rank, failure in sorted(failures.items()):
        detail = getattr(failure, "message", "") or ""
        shown.append(
            f"rank {rank} exited with code {getattr(failure, 'exitcode', '?')}"
            + (f" ({detail})" if detail and detail != "N/A" else "")
        )
    return "; ".join(shown) or str(exc)


def run_torchrun(
    launcher: Any, nproc_per_node: int, plan_path: Path, run_dir: Path, worker: str | None = None, *, entry: str
) -> dict[int, Any]:
    """Run this node's part of the job under torch's elastic agent; block until it ends.

    Every node of the job must call it with the same rdzv_endpoint and rdzv_id. Its
    ranks run `python -m ENTRY --plan PLAN_PATH --run-dir RUN_DIR [--worker WORKER]`
    (the engine passes clorch.engine.as_rank, and the launch plan this node's launching
    process checked and wrote with clorch.plan.plan_file.write_plan).

    Raises:
        TorchrunError: the nodes did not meet in time, or a rank failed after the restarts.
    """
    # lazy: keeps torch out of clorch-train's start
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    # lazy: keeps torch out of clorch-train's start
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    # lazy: keeps torch out of clorch-train's start
    from torch.distributed.launcher.api import elastic_launch

    low = _node_range(launcher.nnodes)[0]
    config = _elastic_config(launcher, nproc_per_node, run_dir)
    os.environ.update(with_multicast_off(os.environ))  # the ranks inherit this environment
    if cpp_warnings_quieted():  # ... with the user's own C++ log level (torch read this process's at import)
        os.environ.pop(CPP_LOG_VARIABLE, None)
    args = ["-u", "-m", entry, "--plan", str(plan_path), "--run-dir", str(run_dir)]
    if worker is not None:
        args += ["--worker", worker]
    watcher = _JoinWatcher(launcher.rdzv_endpoint, launcher.rdzv_id, needed=low)
    watcher.start()
    try:
        return elastic_launch(config, sys.executable)(*args)
    except ChildFailedError as exc:
        raise TorchrunError(f"a rank failed: {_describe_failure(exc)}; logs in {run_dir}") from None
    except RendezvousError as exc:
        raise TorchrunError(
            f"the nodes did not meet at launcher.rdzv_endpoint={launcher.rdzv_endpoint} "
            f"(rdzv_id {launcher.rdzv_id}): launcher.nnodes={launcher.nnodes} needs {low} node(s); "
            f"{watcher.describe()} within launcher.rdzv_timeout={launcher.rdzv_timeout:g} s "
            f"({type(exc).__name__}{': ' + str(exc) if str(exc) else ''})"
        ) from None
    finally:
        watcher.stop()


def _elastic_config(launcher: Any, nproc_per_node: int, run_dir: Path) -> Any:
    """torch's LaunchConfig for this node: the c10d rendezvous at launcher.rdzv_endpoint, waiting
    launcher.rdzv_timeout seconds (at least 1) for the nodes, launcher.max_restarts restarts of the
    whole group, spawned ranks, and each rank's logs in RUN_DIR/logs."""
    # lazy: keeps torch out of clorch-train's start
    from torch.distributed.elastic.multiprocessing import Std

    # lazy: keeps torch out of clorch-train's start
    from torch.distributed.launcher.api import LaunchConfig

    low, high = _node_range(launcher.nnodes)
    timeout = int(max(1, round(launcher.rdzv_timeout)))
    return LaunchConfig(
        min_nodes=low,
        max_nodes=high,
        nproc_per_node=nproc_per_node,
        run_id=launcher.rdzv_id,
        rdzv_endpoint=launcher.rdzv_endpoint,
        rdzv_backend="c10d",
        rdzv_configs={"join_timeout": timeout, "timeout": timeout},
        rdzv_timeout=timeout,
        max_restarts=launcher.max_restarts,
        start_method="spawn",
        logs_specs=run_logs(run_dir / "logs", Std),
        log_line_prefix_template="[rank${rank}]:",
    )


def run_logs(log_dir: Path, std: Any) -> Any:
    """torch's LogsSpecs that puts each rank's files in `log_dir` (see the module docstring),
    copied to the console (tee); `std` is torch's Std enum."""
    # lazy: keeps torch out of clorch-train's start
    from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs

    class RunLogs(LogsSpecs):
        def __init__(self) -> None:
            super().__init__(log_dir=str(log_dir), redirects=std.ALL, tee=std.ALL)

        @property
        def root_log_dir(self) -> str:
            return str(log_dir)

        def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
            log_dir.mkdir(parents=True, exist_ok=True)
            dest = LogsDest()
            for local_rank, env in envs.items():
                restart = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
                stem = log_dir / (f"rank_{env['RANK']}" + (f".restart_{restart}" if restart else ""))
                dest.stdouts[local_rank] = dest.tee_stdouts[local_rank] = f"{stem}.stdout"
                dest.stderrs[local_rank] = dest.tee_stderrs[local_rank] = f"{stem}.stderr"
                dest.error_files[local_rank] = env["TORCHELASTIC_ERROR_FILE"] = f"{stem}.error.json"
            return dest

    return RunLogs()


class _JoinWatcher(threading.Thread):
    """Reads, while the agent waits, which nodes have joined the c10d rendezvous.

    torch's agent does not say who joined when it gives up, so this thread polls
    the rendezvous state the agents keep in the endpoint's store (key
    `torch.rendezvous.<rdzv_id>`, torch's own format, read with the same
    decoding the agents use). When the format cannot be read it reports nothing
    rather than guessing. It stops once `needed` nodes have joined: the store's host is
    another node's process, which may end first, and a store call after that prints
    a C++ stack trace (TCPStore's "sendBytes failed ... frame #0 ...") on this
    node's console, however healthy the job.
    """

    def __init__(self, endpoint: str, run_id: str, needed: int = 1) -> None:
        super().__init__(name="clorch-rdzv-watch", daemon=True)
        self.endpoint, self.key, self.needed = endpoint, f"torch.rendezvous.{run_id}", needed
        self.joined: list[str] | None = None
        self._done = threading.Event()

    def run(self) -> None:
        # lazy: keeps torch out of clorch-train's start
        import torch.distributed as dist

        host, _, port = self.endpoint.rpartition(":")
        store = None
        while not self._done.wait(0.5):
            try:
                if store is None:
                    store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=2))
                if store.check([self.key]):
                    self.joined = _participants(store.get(self.key))
            except Exception:  # no store yet, or gone: keep what was read
                store = None
            if self.joined is not None and len(self.joined) >= self.needed:
                return  # the nodes met: nothing left to tell

    def stop(self) -> None:
        self._done.set()

    def describe(self) -> str:
        if not self.joined:  # not read in time (a loaded machine, a short timeout): this node joined
            return f"1 node(s) joined ({socket.gethostname()}, this node); no other was seen"
        return f"{len(self.joined)} node(s) joined ({', '.join(self.joined)})"


def _participants(raw: bytes) -> list[str] | None:
    """`host (pid N)` of each node in torch's pickled rendezvous state, or None if unreadable."""
    try:
        state = pickle.loads(b64decode(raw))  # what torch's agents themselves store and load
        nodes = list(state.participants) + list(state.wait_list)
        return sorted(f"{node.addr} (pid {node.pid})" for node in nodes)
    except Exception:
        return None
