"""Ctrl-C, SIGTERM and SIGHUP to `clorch-train`: the ranks stop, summary.json says
"interrupted", no traceback anywhere, and the printed command resumes the run."""

from __future__ import annotations

import json
import os
import shlex
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pytest

from clorch.engine.interrupts import Interrupted, interrupts_raise
from clorch.runs.cli import run_cli
from tests.harness import free_port
from tests.clirunner import CliProcess, run_clorch_train, start_clorch_train
from tests.engine.signalled_start import sigint_after, sigint_dropped

pytestmark = pytest.mark.timeout(240)
ROOT = Path(__file__).resolve().parents[2]
ARGS = ["+recipe=cpu_smoke", "epochs=100", "checkpoint=periodic", "checkpoint.every_n_steps=5"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _wait_for_a_checkpoint(run_dir: Path, proc: CliProcess) -> None:
    deadline = time.monotonic() + 120
    while not list((run_dir / "checkpoints").glob("step_*.ckpt")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no checkpoint within 120 s"
        time.sleep(0.1)


def _wait_for_hydra(run_dir: Path, proc: CliProcess) -> None:
    """Until the run directory has its .hydra/ (clorch-train marks the directory in use there before
    Hydra starts, then Hydra writes its records): from then on a signal must leave the run
    listed; nothing is launched yet."""
    deadline = time.monotonic() + 120
    while not (run_dir / ".hydra").is_dir():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no run directory within 120 s"
        time.sleep(0.01)


def _interrupt(cwd: Path, args: list[str], watched: Path, signals: list[int]) -> tuple[CliProcess, str]:
    """`clorch-train ARGS` in `cwd`, `signals` sent (0.2 s apart) once `watched` (a run directory)
    has a checkpoint (the "early" case: once Hydra has made it); the ended process and its stderr."""
    proc = start_clorch_train(args, cwd, env=_env())
    (_wait_for_hydra if cwd.name.startswith("early") else _wait_for_a_checkpoint)(watched, proc)
    for signum in signals:
        proc.send_signal(signum)
        time.sleep(0.2)
    _, stderr = proc.communicate(timeout=120)
    return proc, stderr


SIGNALS = {
    "int": [signal.SIGINT],
    "term": [signal.SIGTERM],
    "hup": [signal.SIGHUP],
    "int-twice": [signal.SIGINT, signal.SIGINT],
}


def _command(case: str, cwd: Path) -> tuple[list[str], Path, list[int]]:
    """A case's arguments, the run directory to watch for a checkpoint, and the signals to send."""
    if case == "sweep":
        return ["-m", *ARGS, "seed=1,2", f"hydra.sweep.dir={cwd / 'sweep'}"], cwd / "sweep" / "0", [signal.SIGINT]
    if case == "torchrun":
        endpoint = f"launcher.rdzv_endpoint=127.0.0.1:{free_port()}"
        return [*ARGS, "launcher=torchrun", endpoint, f"hydra.run.dir={cwd / 'run'}"], cwd / "run", [signal.SIGINT]
    if case == "early":
        return [*ARGS, f"hydra.run.dir={cwd / 'run'}"], cwd / "run", [signal.SIGINT]
    if case == "int":  # nothing to resume yet: the run says so, and starts from step 0
        return [*ARGS, "checkpoint.resume=latest", f"hydra.run.dir={cwd / 'run'}"], cwd / "run", SIGNALS[case]
    return [*ARGS, f"hydra.run.dir={cwd / 'run'}"], cwd / "run", SIGNALS[case]


@pytest.fixture(scope="module")
def signalled(tmp_path_factory) -> dict[str, tuple[Path, CliProcess, str]]:
    """{case: (its working directory, the ended process, its stderr)} for each case of SIGNALS, a
    sweep and a launcher=torchrun run: all side by side, each signalled once it has a checkpoint (a
    thread each). The "int" run is also the one test_the_printed_command_resumes_the_run resumes."""
    cases = [*SIGNALS, "sweep", "torchrun", "early"]
    dirs = {case: tmp_path_factory.mktemp(case) for case in cases}
    with ThreadPoolExecutor(len(cases)) as pool:
        ended = {case: pool.submit(_interrupt, dirs[case], *_command(case, dirs[case])) for case in cases}
    return {case: (dirs[case], *future.result()) for case, future in ended.items()}


@pytest.mark.parametrize("signals", list(SIGNALS.values()), ids=list(SIGNALS))
def test_a_signal_ends_the_run_cleanly(signals, signalled):
    (case,) = [case for case, sent in SIGNALS.items() if sent == signals]
    tmp_path, proc, stderr = signalled[case]
    run_dir = tmp_path / "run"
    name = signal.Signals(signals[0]).name
    assert proc.returncode == 128 + signals[0], stderr
    assert f"clorch-train: interrupted by {name} after step" in stderr
    assert "resume with: clorch-train" in stderr
    # The step named is the one reached: never before the checkpoint the hint resumes.
    reached = int(stderr.split(" after step ", 1)[1].split()[0])
    assert reached >= int(stderr.split("the latest checkpoint is step ", 1)[1].split(";")[0])
    assert "Traceback" not in stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["interrupted_by"] == name
    for log in (run_dir / "logs").glob("rank_*.stderr"):
        assert "Traceback" not in log.read_text(), log


def test_the_printed_command_resumes_the_run(signalled):
    tmp_path, _, stderr = signalled["int"]
    run_dir = tmp_path / "run"
    first = json.loads((run_dir / "events.jsonl").read_text().splitlines()[0])
    assert first["message"].startswith("checkpoint.resume=latest: nothing to resume: ")
    command = shlex.split(stderr.split("resume with: ", 1)[1].splitlines()[0])
    assert command[0] == "clorch-train" and command[-1] == "checkpoint.resume=latest"
    resumed_dir = tmp_path / "resumed"
    done = run_clorch_train([*command[1:], f"hydra.run.dir={resumed_dir}"], tmp_path, env=_env(), timeout=150)
    assert done.returncode == 0, done.stderr
    summary = json.loads((resumed_dir / "summary.json").read_text())
    assert summary["resumed_from"].startswith(str(run_dir / "checkpoints" / "step_"))
    assert summary["status"] == "succeeded" and summary["steps"] == summary["planned_steps"] == 400


def test_an_interrupt_ends_the_whole_sweep(signalled):
    tmp_path, proc, stderr = signalled["sweep"]
    sweep_dir = tmp_path / "sweep"
    assert proc.returncode == 130, stderr
    assert json.loads((sweep_dir / "0" / "summary.json").read_text())["status"] == "interrupted"
    assert not (sweep_dir / "1").exists(), "the sweep's next job did not start"


def test_an_interrupt_under_launcher_torchrun_is_recorded_too(signalled):
    tmp_path, proc, stderr = signalled["torchrun"]
    run_dir = tmp_path / "run"
    assert proc.returncode == 130, stderr
    assert "clorch-train: interrupted by SIGINT after step" in stderr and "resume with:" in stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["launcher"] == "torchrun"


def test_an_interrupt_before_launch_leaves_a_run_listed_as_interrupted(signalled, capsys):
    """Ctrl-C while the run is checked (its directory made, no rank started): summary.json says
    interrupted, so `clorch-runs ls` lists the run."""
    tmp_path, proc, stderr = signalled["early"]
    assert proc.returncode == 130, stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["interrupted_by"] == "SIGINT"
    capsys.readouterr()
    assert run_cli(["ls", "--root", str(tmp_path), "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["status"] == "interrupted"


@pytest.mark.parametrize("point", ["checks", "marked"])
def test_a_signal_before_hydra_starts_ends_the_command_cleanly(point, tmp_path, capsys):
    """Ctrl-C once the config is checked, before a run directory exists ("checks": none is left),
    or once clorch-train has made it, before Hydra starts ("marked": it is listed as interrupted):
    exit 130, one line, no traceback."""
    entry = partial(sigint_after, point)
    proc = start_clorch_train(ARGS, tmp_path, env=_env(), entry=entry)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "clorch-train: interrupted by SIGINT" in stderr and "Traceback" not in stderr, stderr
    made = [path.parent for path in (tmp_path / "outputs").glob("*/*/summary.json")]
    if point == "checks":
        assert not list((tmp_path / "outputs").glob("*/*")), "a run directory was left"
        return
    (run_dir,) = made
    assert json.loads((run_dir / "summary.json").read_text())["interrupted_by"] == "SIGINT"
    capsys.readouterr()
    assert run_cli(["ls", "--root", str(tmp_path), "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["status"] == "interrupted"


def test_a_signal_whose_interrupt_was_dropped_still_ends_the_run_before_its_ranks_start(tmp_path):
    """Ctrl-C in Hydra's job whose Interrupted a library wraps and drops (Python 3.11 wraps one
    raised while a class is created): no rank is launched; exit 130, listed as interrupted.
    Before, the run trained to its end and ignored every later Ctrl-C."""
    args = ["+recipe=cpu_smoke", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = start_clorch_train(args, tmp_path, env=_env(), entry=sigint_dropped)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "clorch-train: interrupted by SIGINT" in stderr and "Traceback" not in stderr, stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists(), "ranks were launched"
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["interrupted_by"] == "SIGINT"


def test_a_block_within_another_keeps_its_handlers_and_an_error_an_interrupt_caused_leaves_as_it():
    """Python 3.11 turns what a signal's handler raises while a class is created (a module being
    imported) into a RuntimeError; the block gives the interrupt back, so no traceback is shown."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        with pytest.raises(Interrupted) as caught:
            with interrupts_raise():
                outer = signal.getsignal(signal.SIGTERM)
                with interrupts_raise():
                    assert signal.getsignal(signal.SIGTERM) is outer
                assert signal.getsignal(signal.SIGTERM) is outer
                with interrupts_raise():
                    try:
                        raise Interrupted(signal.SIGTERM)
                    except Interrupted as exc:
                        raise RuntimeError("Error calling __set_name__ on 'Field' instance") from exc
        assert caught.value.signum == signal.SIGTERM
        with pytest.raises(ValueError):
            with interrupts_raise():
                raise ValueError("not an interrupt")
    finally:  # after an interrupt the block ignores later signals (the process is ending): not pytest's
        for signum, handler in saved.items():
            signal.signal(signum, handler)
