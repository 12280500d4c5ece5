"""Run `clorch-train` as its own process, forked from the test harness's forkserver.

`run_clorch_train(args, cwd)` does what `subprocess.run(["clorch-train", *args],
cwd=cwd, capture_output=True, text=True)` does: a process of its own with the
given arguments, working directory and environment, its exit code (negative for
a signal), stdout and stderr. The process is forked from the server that already
imported torch (see `tests.harness`), which saves the 2-3 s of CPU that torch's
import costs a fresh interpreter; the ranks it launches are fresh interpreters as
always. `start_clorch_train` gives a handle with Popen's `pid`, `poll`,
`send_signal`, `communicate` and `returncode`; signals reach the process as they
would a subprocess (its handlers are Python's defaults until clorch-train sets its
own). Use a real subprocess where a test needs a terminal or runs another program.

`run_clorch_train_batch([(args, cwd), ...])` runs several commands one after the
other in one such process, each through the same `clorch.cli.main` a console
script calls, with its own arguments, working directory, a fresh copy of the
environment, its own stdout and stderr, and its exit code. Hydra's and clorch's
imports and Hydra's first start are paid once per batch instead
of once per command (a second or two each on a loaded 2-core machine); the last
command's exit status is the process's own. Batch only
commands that end before launching ranks (config errors, refusals, printed
configs): one that launches a job or is signalled gets a process of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

from tests.harness import _context, take_callers_state


def _main(args: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """`clorch-train ARGS` in this process, its output into the files `out` and `err`."""
    take_callers_state(env, cwd)
    _redirect(out, err)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    sys.argv = ["clorch-train", *args]
    from clorch.cli import main

    try:
        main()  # leaves through SystemExit with the command's exit code
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _exit_code(exc: SystemExit) -> int:
    """The exit status Python gives a process ended by `exc` (a message counts as 1)."""
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1


def _redirect(out: str, err: str) -> None:
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)


def _batch_main(calls: list[tuple[list[str], str]], env: dict[str, str], workdir: str) -> None:
    take_callers_state(env, calls[0][1])
    _redirect(str(Path(workdir, "setup.out")), str(Path(workdir, "setup.err")))
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # follow the descriptors redirected per command
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    from clorch.cli import main

    for index, (args, cwd) in enumerate(calls):
        take_callers_state(env, cwd)  # each command: the caller's environment afresh, its own directory
        _redirect(str(Path(workdir, f"{index}.out")), str(Path(workdir, f"{index}.err")))
        sys.argv = ["clorch-train", *args]
        code = None  # stays None when main() raises anything but SystemExit: the batch ends there
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc)
            if index == len(calls) - 1:
                raise  # the last command's exit status is the process's, as a shell would see it
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            if code is not None:
                Path(workdir, f"{index}.code").write_text(str(code))


class CliProcess:
    """A started `clorch-train`: `communicate(timeout)` waits and returns (stdout, stderr)."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str] | None, entry: Callable = _main):
        self.args = ["clorch-train", *args]
        self._dir = tempfile.TemporaryDirectory(prefix="clorch-cli-")
        self._out, self._err = Path(self._dir.name, "stdout"), Path(self._dir.name, "stderr")
        self._proc = _context().Process(
            target=entry,
            daemon=True,
            args=(list(args), str(cwd), dict(os.environ if env is None else env), str(self._out), str(self._err)),
        )
        self._proc.start()
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        return self._proc.pid

    def poll(self) -> int | None:
        """The exit code once the process has ended, else None."""
        if self._proc.is_alive():
            return None
        self.returncode = self._proc.exitcode
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self._proc.is_alive():
            os.kill(self._proc.pid, signum)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(10)
            raise subprocess.TimeoutExpired(self.args, timeout)
        self.returncode = self._proc.exitcode
        try:
            return self._out.read_text(), self._err.read_text()
        finally:
            self._dir.cleanup()


def start_clorch_train(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, entry: Callable | None = None
) -> CliProcess:
    """Start `clorch-train ARGS` in `cwd` with `env` (default: this process's environment).

    `entry`: a module-level function that takes `_main`'s arguments and calls it, to inject a
    fault around clorch-train in its process (a test's wrapping entry point).
    """
    return CliProcess(args, cwd, env, entry or _main)


def run_clorch_train(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess:
    """`clorch-train ARGS` to its end, as subprocess.run(..., capture_output=True, text=True) returns it.

    Raises:
        subprocess.TimeoutExpired: it ran past `timeout` seconds (it is killed).
    """
    proc = start_clorch_train(args, cwd, env)
    out, err = proc.communicate(timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_clorch_train_batch(
    calls: list[tuple[list[str], Path]], env: dict[str, str] | None = None, timeout: float | None = None
) -> list[subprocess.CompletedProcess]:
    """`clorch-train ARGS` in `cwd` for each (ARGS, cwd) in turn, all in one process; each one's
    exit code, stdout and stderr, as run_clorch_train gives them.

    Raises:
        subprocess.TimeoutExpired: the batch ran past `timeout` seconds (it is killed).
        AssertionError: the process ended before every command had returned (a crash).
    """
    env = dict(os.environ if env is None else env)
    with tempfile.TemporaryDirectory(prefix="clorch-cli-batch-") as workdir:
        proc = _context().Process(
            target=_batch_main,
            daemon=True,
            args=([(list(args), str(cwd)) for args, cwd in calls], env, workdir),
        )
        proc.start()
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join(10)
            raise subprocess.TimeoutExpired(["clorch-train (batch)", *(" ".join(a) for a, _ in calls)], timeout)
        done = []
        for index, (args, _) in enumerate(calls):
            out, err, code = (Path(workdir, f"{index}{suffix}") for suffix in (".out", ".err", ".code"))
            if not code.exists():
                found = err.read_text() if err.exists() else Path(workdir, "setup.err").read_text()
                raise AssertionError(
                    f"the batch process ended (exit code {proc.exitcode}) in clorch-train {' '.join(args)}:\n{found}"
                )
            command, returncode = ["clorch-train", *args], int(code.read_text())
            if index == len(calls) - 1:
                assert proc.exitcode == returncode, f"exit code {proc.exitcode}, main() exited with {returncode}"
            done.append(subprocess.CompletedProcess(command, returncode, out.read_text(), err.read_text()))
        return done
