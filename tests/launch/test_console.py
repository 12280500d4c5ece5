"""The console is not the run: a console that goes away (`| head -1`, a `tee` ended by Ctrl-C)
never stops or spoils a run of clorch-train, nor changes its exit status."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from clorch.launch.console import SafeStream

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(240)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _train(args: list[str], cwd: Path) -> subprocess.Popen:
    """clorch-train, its stdout and stderr both into one pipe (as `2>&1 | ...`)."""
    return subprocess.Popen(
        [sys.executable, "-m", "clorch.cli", *args],
        cwd=cwd,
        env=_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def test_a_write_to_a_closed_pipe_is_dropped_and_the_descriptor_goes_to_dev_null():
    read, write = os.pipe()
    os.close(read)
    stream = SafeStream(open(write, "w", buffering=1))
    stream.write("one line\n")  # the pipe has no reader: EPIPE
    assert stream.gone
    stream.write("more\n")
    stream.flush()
    assert os.path.samestat(os.fstat(write), os.stat(os.devnull))
    stream.wrapped.close()


def test_a_line_cut_short_by_ctrl_c_does_not_swallow_the_next_logged_line(tmp_path):
    """A progress print interrupted between its text and its newline, then clorch-train's report."""
    console = io.StringIO()
    stream = SafeStream(console, logging.WARNING)
    handler = logging.FileHandler(tmp_path / "run.log")
    logging.getLogger().addHandler(handler)
    try:
        stream.write("step 8/400  loss 1.193")  # print's newline never came
        print("clorch-train: interrupted by SIGINT after step 8", file=stream)
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    assert console.getvalue() == "step 8/400  loss 1.193\nclorch-train: interrupted by SIGINT after step 8\n"
    assert (tmp_path / "run.log").read_text() == "interrupted by SIGINT after step 8\n"


def test_the_exit_flush_into_a_closed_pipe_keeps_the_exit_status():
    """Python's own flush of stdout at exit would otherwise fail and exit 120 (or 1)."""
    code = (
        "import sys; from clorch.launch.console import protect; protect(); "
        "print('x' * 100000); print('y', file=sys.stderr); sys.exit(3)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first write
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 3, stderr
    assert b"BrokenPipe" not in stderr and b"Exception ignored" not in stderr, stderr
    assert stderr.strip() == b"y"


def _head_1(proc: subprocess.Popen, first: dict) -> None:
    """`| head -1`: read one line, then go away."""
    first[proc.pid] = proc.stdout.readline()
    proc.stdout.close()


@pytest.fixture(scope="module")
def headed(tmp_path_factory) -> dict[str, tuple[Path, subprocess.Popen, bytes]]:
    """{launcher: (its run directory, its ended clorch-train, the one line read)}: both runs side by
    side, each read by its own `head -1` (a thread), which goes away after the first line as before."""
    procs, first = {}, {}
    for launcher in ("local", "torchrun"):
        tmp_path = tmp_path_factory.mktemp(launcher)
        run_dir = tmp_path / "run"
        args = ["+recipe=cpu_smoke", "epochs=5", f"launcher={launcher}", f"hydra.run.dir={run_dir}"]
        procs[launcher] = (run_dir, _train(args, tmp_path))
    heads = [threading.Thread(target=_head_1, args=(proc, first), daemon=True) for _, proc in procs.values()]
    for head in heads:
        head.start()
    for head in heads:
        head.join(200)
    for _, proc in procs.values():
        try:
            proc.wait(timeout=200)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return {launcher: (run_dir, proc, first.get(proc.pid, b"")) for launcher, (run_dir, proc) in procs.items()}


@pytest.mark.parametrize("launcher", ["local", "torchrun"])
def test_a_reader_that_closes_after_one_line_does_not_stop_the_run(headed, launcher):
    """`clorch-train ... 2>&1 | head -1`: the run finishes, writes its summary and exits 0.
    Under launcher=torchrun the ranks' output also goes to logs/ (and from there to the console)."""
    run_dir, proc, first = headed[launcher]
    assert proc.returncode == 0
    assert first.startswith(b"clorch: running")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["steps"] == summary["planned_steps"] == 20
    assert "step 20/20" in (run_dir / "logs" / "rank_0.stdout").read_text()
    assert (run_dir / "logs" / "rank_1.stderr").is_file()


def test_ctrl_c_with_the_reader_gone_ends_interrupted_with_the_resume_hint_in_the_log(tmp_path):
    """`clorch-train ... 2>&1 | tee log` and Ctrl-C, which ends tee too: exit 130, summary.json
    "interrupted", and the resume hint in the run's log (the console is gone)."""
    run_dir = tmp_path / "run"
    proc = _train(
        [
            "+recipe=cpu_smoke",
            "epochs=100",
            "checkpoint=periodic",
            "checkpoint.every_n_steps=5",
            f"hydra.run.dir={run_dir}",
        ],
        tmp_path,
    )
    reading = threading.Event()
    reading.set()

    def tee() -> None:  # reads while `reading` is set, then goes away as tee does
        while reading.is_set() and proc.stdout.readline():
            pass
        proc.stdout.close()

    reader = threading.Thread(target=tee, daemon=True)
    reader.start()
    deadline = time.monotonic() + 150
    while not list((run_dir / "checkpoints").glob("step_*.ckpt")):
        assert proc.poll() is None, "clorch-train ended before its first checkpoint"
        assert time.monotonic() < deadline, "no checkpoint within 150 s"
        time.sleep(0.1)
    reading.clear()
    reader.join(30)  # the next line clorch-train writes lets the reader see it should go
    assert not reader.is_alive()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=150) == 130
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["interrupted_by"] == "SIGINT"
    log = (run_dir / "clorch-train.log").read_text()
    assert "interrupted by SIGINT after step" in log
    assert "resume with: clorch-train" in log


def test_a_descriptor_closed_at_start_is_filled_so_no_file_takes_its_number():
    """`2>&-`: Python starts with sys.stderr None, and the next file opened would get descriptor 2."""
    code = (
        "import os, sys; from clorch.launch.console import protect; assert sys.stderr is None; protect(); "
        "print('clorch-train: to nowhere', file=sys.stderr); f = open(os.devnull); "
        "print(f.fileno() > 2, os.path.samestat(os.fstat(2), os.stat(os.devnull)), sys.stderr.gone)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=_env(), stdout=subprocess.PIPE, preexec_fn=lambda: os.close(2), timeout=60
    )
    assert done.returncode == 0 and done.stdout == b"True True True\n"


@pytest.fixture(scope="module")
def closed_at_start(tmp_path_factory) -> dict[int, tuple[Path, int]]:
    """{descriptor: (the run directory, the exit status)} of `clorch-train ... >&-` (1) and `2>&-`
    (2), side by side."""
    procs = {}
    for closed in (1, 2):
        tmp_path = tmp_path_factory.mktemp(f"closed{closed}")
        args = ["+recipe=cpu_smoke", f"hydra.run.dir={tmp_path / 'run'}"]
        procs[closed] = (
            tmp_path / "run",
            subprocess.Popen(
                [sys.executable, "-m", "clorch.cli", *args],
                cwd=tmp_path,
                env=_env(),
                stdin=subprocess.DEVNULL,
                preexec_fn=lambda fd=closed: os.close(fd),
            ),
        )
    return {closed: (run_dir, proc.wait(timeout=200)) for closed, (run_dir, proc) in procs.items()}


@pytest.mark.parametrize("closed", [1, 2])
def test_a_console_closed_at_start_never_stops_the_run(closed_at_start, closed):
    """`clorch-train ... 2>&-` and `>&-`: the run ends succeeded, with its summary and exit status 0."""
    run_dir, code = closed_at_start[closed]
    assert code == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["steps"] == summary["planned_steps"]
