"""`python -m clorch.launch [options] package.module:function`: launch, wait, report, exit.

The exit code follows the policy in the `clorch.launch` module docstring.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any

from clorch.status import Status
from clorch.launch.console import protect
from clorch.launch.launcher import launch

TIMED_OUT_EXIT = 124


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m clorch.launch", description="Run package.module:function on one process per rank."
    )
    parser.add_argument("main", help="entry point, package.module:function, called with the rank's ctx dict")
    parser.add_argument("--nproc-per-node", type=int, default=None, help="ranks on this node")
    parser.add_argument(
        "--devices",
        type=lambda s: [int(d) for d in s.split(",")],
        default=None,
        help="CUDA device indices, comma-separated, one per local rank",
    )
    parser.add_argument("--args", type=json.loads, default=None, help="JSON value passed as ctx['args']")
    parser.add_argument("--backend", default="auto", help="auto, nccl, gloo or none")
    parser.add_argument("--timeout", type=float, default=None, help="seconds for the whole job")
    parser.add_argument("--log-dir", default=None, help="logs and job record (default: a fresh temp dir)")
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--master-addr", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, default=None)
    parser.add_argument("--max-restarts", type=int, default=0)
    parser.add_argument("--grace-period", type=float, default=10.0, help="seconds from SIGTERM to SIGKILL")
    return parser


def exit_code(status: dict[str, Any]) -> int:
    """The launcher's exit code for a final status (see the module docstring's policy)."""
    if status["state"] == Status.SUCCEEDED:
        return 0
    if status["state"] == Status.TIMED_OUT:
        return TIMED_OUT_EXIT
    if status["state"] == Status.STOPPED:
        return 128 + int(signal.SIGTERM)
    error = status.get("error") or {}
    if error.get("signal"):
        return 128 + int(signal.Signals[error["signal"]])
    code = error.get("exit_code")
    return code if isinstance(code, int) and 0 < code < 256 else 1


def main(argv: list[str] | None = None) -> int:
    options = vars(_parser().parse_args(argv))
    if options["backend"] == "none":
        options["backend"] = None
    target = options.pop("main")
    try:
        job = launch(target, **options)
    except (TypeError, ValueError) as exc:
        print(f"clorch.launch: {exc}", file=sys.stderr)
        return 2
    print(f"clorch.launch: logs in {job.log_dir}", file=sys.stderr, flush=True)
    status = job.wait()
    line = f"clorch.launch: job {status['state']}"
    if status["error"]:
        line += f" (rank {status['error']['rank']}: {status['error']['message']})"
    print(line, file=sys.stderr)
    return exit_code(status)


if __name__ == "__main__":
    protect()  # a closed pipe on the console must not end the job nor change its exit code
    sys.exit(main())
