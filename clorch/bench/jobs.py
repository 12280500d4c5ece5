"""Running a benchmark's ranks as one clorch job and printing rank 0's table."""

from __future__ import annotations

import sys
from typing import Any

from clorch.launch import await_job, job_logs, job_status, launch
from clorch.status import Status


def run_and_print_table(
    target: str, *, nproc: int, backend: str, devices: list[int] | None, args: dict[str, Any], timeout: float
) -> int:
    """Launch `target` ("module:worker") on `nproc` ranks, wait, and print the `table` rank 0's
    worker returned; 0 when the job succeeded, else 1 after printing rank 0's stderr and the error."""
    job = launch(target, nproc_per_node=nproc, backend=backend, devices=devices, args=args, timeout=timeout)
    status = await_job(job)
    if status.get("state") != Status.SUCCEEDED:
        print(job_logs(job, 0).get("stderr", ""), file=sys.stderr)
        print(f"benchmark job ended {status.get('state')}: {status.get('error')}", file=sys.stderr)
        return 1
    print(job_status(job)["results"][0]["table"])
    return 0
