"""Entry points for the launcher tests: `tests.launch.workers:NAME`.

Most need no torch (launched with backend=None) so that each rank starts in
a fraction of a second; the ones named gloo_* run in a real gloo group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ENV_NAMES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMP_NUM_THREADS",
    "CLORCH_RESTART_COUNT",
    "PYTHONUNBUFFERED",
    "NCCL_NVLS_ENABLE",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    "NVSHMEM_DISABLE_NVLS",
    "CUDA_VISIBLE_DEVICES",
    "CLORCH_TEST_MARK",
    "TORCH_CPP_LOG_LEVEL",
    "CLORCH_STORE_FD",
)


def report(ctx):
    """Print to both streams; return ctx (without the group) and the clorch environment."""
    print(f"stdout of rank {ctx['rank']}")
    print(f"stderr of rank {ctx['rank']}", file=sys.stderr)
    fields = {k: v for k, v in ctx.items() if k != "process_group"}
    return {
        "ctx": fields,
        "env": {name: os.environ.get(name) for name in ENV_NAMES},
        "torch_imported": "torch" in sys.modules,
    }


def wait_for_release(ctx):
    """Block until the file at args["release"] exists (at most 30 s), in the group when there is one."""
    release = Path(ctx["args"]["release"])
    deadline = time.monotonic() + 30
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return release.exists()


def torch_group(ctx):
    """Launched without a backend: make the group with torch's own env:// init, all-reduce the ranks."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        tensor = torch.tensor([float(ctx["rank"])])
        dist.all_reduce(tensor)
        return tensor.item()
    finally:
        dist.destroy_process_group()


def gloo_group_again(ctx):
    """In a real gloo group: rank 0 starts a program that keeps every descriptor (as os.system does),
    the group ends while rank 1 is still connected, then both make a new group on the same port."""
    import gc

    import torch
    import torch.distributed as dist

    import clorch.distributed as cd

    keeper = subprocess.Popen(["sleep", "30"], close_fds=False) if ctx["rank"] == 0 else None
    try:
        dist.all_reduce(torch.ones(1))
        ctx["process_group"] = None
        if ctx["rank"] == 1:
            time.sleep(1)  # rank 0's store closes first: its connections linger on the port
        cd.destroy_process_group()
        gc.collect()
        cd.init_process_group("gloo", timeout=20)
        total = torch.ones(1)
        dist.all_reduce(total)
        return total.item()
    finally:
        if keeper is not None:
            keeper.kill()
            keeper.wait()


def returns_a_set(ctx):
    """A return value JSON cannot hold: the job succeeds, the result is not stored."""
    return {ctx["rank"]}


def _spawn_grandchild(ctx) -> None:
    """Start a long sleeper and record (rank pid, grandchild pid) for the test to check."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    pid_dir = Path(ctx["args"]["pid_dir"])
    tmp = pid_dir / f"rank_{ctx['rank']}.tmp"
    tmp.write_text(json.dumps({"rank": os.getpid(), "grandchild": child.pid}))
    os.replace(tmp, pid_dir / f"rank_{ctx['rank']}.json")


def grandchild_then(ctx):
    """Spawn a grandchild, then act per args["then"] ("return", "sleep", "raise" on rank 1)."""
    _spawn_grandchild(ctx)
    then = ctx["args"].get("then", "return")
    if then == "raise" and ctx["rank"] == 1:
        time.sleep(0.3)
        raise ValueError("rank 1 gave up")
    if then in ("sleep", "raise"):
        time.sleep(120)
    return ctx["rank"]


def exit_with(ctx):
    """Rank 1 calls sys.exit(args["code"]); the others wait to be stopped."""
    if ctx["rank"] == 1:
        sys.exit(ctx["args"]["code"])
    time.sleep(120)


def segfault(ctx):
    """Rank 1 prints (no flush) and dies by SIGSEGV; the others wait to be stopped."""
    if ctx["rank"] == 1:
        print("last words before the crash")
        os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(120)


def hang_ignoring_sigterm(ctx):
    """A hung rank that ignores SIGTERM: only SIGKILL ends it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    Path(ctx["args"]["pid_dir"], f"ready_{ctx['rank']}").write_text("1")
    time.sleep(120)


def flaky(ctx):
    """Fail until the restart count reaches args["succeed_at"]; return the count and port."""
    count = int(os.environ["CLORCH_RESTART_COUNT"])
    if count < ctx["args"]["succeed_at"]:
        raise RuntimeError(f"attempt {count} fails on purpose")
    return {"restart": count, "port": int(os.environ["MASTER_PORT"])}


def gloo_all_reduce(ctx):
    """All-reduce a random tensor seeded by rank; return it, the ctx fields and the group size."""
    import torch
    import torch.distributed as dist

    from clorch.distributed import all_reduce

    gen = torch.Generator().manual_seed(1000 + ctx["rank"])
    tensor = torch.randn(5, generator=gen, dtype=torch.float64)
    all_reduce(tensor)
    fields = {k: v for k, v in ctx.items() if k != "process_group"}
    return {"sum": tensor.tolist(), "ctx": fields, "group_size": dist.get_world_size(ctx["process_group"])}


def gloo_fail_fast(ctx):
    """In a real gloo group: rank 1 raises; rank 0 (with a grandchild) sleeps instead of calling a collective."""
    import torch

    from clorch.distributed import all_reduce

    all_reduce(torch.randn(3))  # the group works before the failure
    if ctx["rank"] == 1:
        # Fail once rank 0 has its grandchild, so the test can see that die too.
        while not Path(ctx["args"]["pid_dir"], "rank_0.json").exists():
            time.sleep(0.02)
        raise ValueError("rank 1 gave up after the first all_reduce")
    _spawn_grandchild(ctx)
    time.sleep(120)


def cuda_all_reduce(ctx):
    """On this rank's one visible GPU: all-reduce a random tensor seeded by rank."""
    import torch

    from clorch.distributed import all_reduce, device

    gen = torch.Generator().manual_seed(3000 + ctx["rank"])
    tensor = torch.randn(6, generator=gen, dtype=torch.float64).to(device())
    all_reduce(tensor)
    return {
        "sum": tensor.cpu().tolist(),
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device_count": torch.cuda.device_count(),
        "device": str(device()),
        "backend": ctx["backend"],
    }


def rank_1_skips_a_collective(ctx):
    """Rank 0 all-reduces; rank 1 never joins it and sleeps."""
    import time

    import torch
    import torch.distributed as dist

    if ctx["rank"] == 1:
        time.sleep(120)
    dist.all_reduce(torch.ones(4))


def _write_escaped_pid(ctx, pid: int) -> None:
    """Record the pid of a process that left the rank's group or session, for the test to check."""
    pid_dir = Path(ctx["args"]["pid_dir"])
    tmp = pid_dir / f"escaped_{ctx['rank']}.tmp"
    tmp.write_text(str(pid))
    os.replace(tmp, pid_dir / f"escaped_{ctx['rank']}.pid")


def _then(ctx):
    """Act per args["then"]: "return", "raise" or "sleep" (until the job is stopped)."""
    then = ctx["args"].get("then", "return")
    if then == "raise":
        # Not before every rank has its escapee: a failure ends the other ranks at once.
        pid_dir = Path(ctx["args"]["pid_dir"])
        while not all((pid_dir / f"escaped_{r}.pid").exists() for r in range(ctx["world_size"])):
            time.sleep(0.02)
        raise RuntimeError(f"rank {ctx['rank']} fails after its child escaped")
    if then == "sleep":
        time.sleep(120)
    return ctx["rank"]


def escape_new_session(ctx):
    """Start `sleep 300` in a session of its own (out of the rank's group and session)."""
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    _write_escaped_pid(ctx, child.pid)
    return _then(ctx)


def escape_process_group(ctx):
    """Start `sleep 300` in a process group of its own (still in the rank's session)."""
    child = subprocess.Popen(["sleep", "300"], process_group=0)
    _write_escaped_pid(ctx, child.pid)
    return _then(ctx)


def escape_double_fork(ctx):
    """Daemonize `sleep 300` the classic way: fork, setsid, fork again; the middle one exits."""
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:  # the forked copies must never return into the rank's code
            os.setsid()
            daemon = os.fork()
            if daemon == 0:
                os.execvp("sleep", ["sleep", "300"])
            os.write(write_end, str(daemon).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    daemon_pid = int(os.read(read_end, 64))
    os.close(read_end)
    os.waitpid(middle, 0)  # the daemon is an orphan now, reparented away from this rank
    _write_escaped_pid(ctx, daemon_pid)
    return _then(ctx)
