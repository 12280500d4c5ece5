"""The Hydra job of `clorch-train` (one run, or one job of a sweep), and running Hydra in-process.

Hydra calls `_train` once per run with the composed config; it runs the job
(clorch.engine.run.execute), prints how it ended and records that in
`clorch.cli.outcome.OUTCOME`, from which the command's exit status is read.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_original_cwd
from omegaconf import DictConfig

from hydra_plugins.clorch_sweepers import register_sweepers

from clorch.cli.outcome import OUTCOME
from clorch.config.checks import ConfigError, print_config_errors
from clorch.config.composer import CONFIG_PATH
from clorch.plan.plan import (
    absolute,
    check_run_dir,
    config_key,
    plan_or_errors,
    resolve,
    run_errors_as_config_errors,
)
from clorch.engine.as_rank import train_as_rank
from clorch.engine.interrupts import Interrupted, interrupts_raise, resume_hint, step_reached
from clorch.engine.outputs import write_json
from clorch.engine import in_process
from clorch.engine.run import execute
from clorch.engine.results import RunResult, RunSummary, last_step
from clorch.engine.summary import record_interrupted_start, show, summary_lines
from clorch.sweep.report import last_statuses
from clorch.launch.external import detect as detect_external
from clorch.status import Status
from clorch.plan.where import Machine


def report(result: RunResult) -> None:
    """Print how a run ended (its status's line; a failure's traceback after it) and record it."""
    summary = result.summary
    OUTCOME.hosted_agent |= result.plan.config.launcher.torch_agent
    if summary.status is Status.INTERRUPTED:
        _report_interrupted(result)
    else:
        show(summary_lines(summary, result.run_dir, final_node=bool(summary.final)))
    OUTCOME.ended(summary.status, result.run_dir)


def _report_interrupted(result: RunResult) -> None:
    summary, run_dir, cfg = result.summary, Path(result.run_dir), result.plan.config
    # The directory clorch-train started in (hydra.job.chdir=true moves the job's): relative
    # paths of the command line are relative to it.
    base = get_original_cwd() if HydraConfig.initialized() else None
    step = step_reached(cfg, run_dir, last_step(summary), base=base)
    print(
        Status.INTERRUPTED.line(
            f" by {summary.interrupted_by} after step {step} of {summary.planned_steps}; "
            f"the ranks were stopped; outputs in {run_dir}"
        ),
        file=sys.stderr,
    )
    print(f"clorch-train: {resume_hint(cfg, run_dir, OUTCOME.argv, base=base)}", file=sys.stderr)
    OUTCOME.interrupted(signal.Signals[summary.interrupted_by].value)


CHECKED: dict[str, Any] = {}
"""Plans a sweep checked before it started, by `clorch.plan.plan.config_key` of their config."""


def remember_plan(cfg: DictConfig, machine: Machine | None = None) -> list[str]:
    """Check one config of a sweep (every error) for the machine its jobs run on (None: this
    one), keeping a plan made for this machine for the job that runs it."""
    plan, errors = plan_or_errors(cfg, machine=machine)
    if plan is not None and (machine is None or machine.is_here):
        # the job may run elsewhere (hydra.job.chdir): its paths made absolute
        CHECKED[config_key(cfg)] = absolute(plan, os.getcwd())
    return errors


def checked_before(cfg: DictConfig, run_dir: str, base: str) -> Any:
    """The plan made for this job when its sweep was checked, before it started (then only
    the run directory is checked here), or None: a single run is checked in its job.

    Raises:
        ConfigError: every run-directory error.
    """
    plan = CHECKED.pop(config_key(cfg, base), None) if CHECKED else None
    return None if plan is None else check_run_dir(plan, run_dir)


@hydra.main(config_path=CONFIG_PATH, config_name="config", version_base=None)
def _train(cfg: DictConfig) -> None:
    """The Hydra job: one multi-rank run in Hydra's output directory."""
    run_dir = HydraConfig.get().runtime.output_dir
    OUTCOME.started(run_dir)
    base = get_original_cwd()  # relative paths are the user's: hydra.job.chdir may have moved us
    try:
        external = detect_external()
        if external is not None:  # one task of a submitit job (hydra/launcher=submitit_*): one rank
            OUTCOME.ended(train_as_rank(cfg, Path(run_dir), external, base=base), run_dir)
            return
        # Within the job: an error an interrupt caused leaves as the interrupt, which Hydra's
        # handling of the job's errors lets pass (run_hydra records it) instead of reporting it.
        with interrupts_raise():
            with run_errors_as_config_errors():
                plan = checked_before(cfg, run_dir, base) or resolve(cfg, run_dir, base=base)
                if in_process.trains_here(plan):  # a sweep's one-rank trial (clorch.engine.in_process)
                    OUTCOME.as_rank = True
                    OUTCOME.ended(in_process.train_here(plan, Path(run_dir)), run_dir)
                    return
                result = execute(plan, run_dir)
            report(result)
    except ConfigError as exc:
        print_config_errors(exc.errors)
        OUTCOME.ended(Status.CONFIG_ERROR, run_dir)
        if OUTCOME.is_sweep:  # a sweep's job keeps its directory, with the reason
            write_json(Path(run_dir) / "summary.json", RunSummary.config_error(exc.errors).to_dict())
        return
    if result.status is Status.INTERRUPTED and OUTCOME.is_sweep:
        # A sweep ends with its interrupted job: Hydra would otherwise start the next one.
        raise Interrupted(OUTCOME.interrupted_by)


def run_hydra(args: list[str], run_dir: str | Path | None = None) -> int:
    """Run the Hydra app on `args` (as if they were the command line); return the exit status.

    `run_dir`: a single run's directory, made before Hydra starts; a signal before the run
    could record its end leaves summary.json there (interrupted), as in a sweep's job's.
    """
    GlobalHydra.instance().clear()  # the checks may have composed in-process
    register_sweepers()  # found however clorch was installed (an editable install hides them from Hydra's scan)
    OUTCOME.start()
    last_statuses.clear()
    saved = sys.argv
    sys.argv = [saved[0] if saved else "clorch-train", *args]
    try:
        with interrupts_raise():
            _train()
    except Interrupted as exc:  # before a run could record its end (its checks, its start), between a sweep's jobs
        unended = OUTCOME.unended or run_dir
        if unended is not None:  # its directory is listed as interrupted
            record_interrupted_start(unended, exc.signal_name)
        print(f"clorch-train: {exc}", file=sys.stderr)
        return Status.INTERRUPTED.exit_code_after(exc.signum)
    except SystemExit as exc:  # Hydra exits after --help and on its own errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else Status.FAILED.exit_code)
    finally:
        sys.argv = saved
    return OUTCOME.exit_status(last_statuses)
