"""The `clorch-train` console script: flags, refusals, then who runs the job.

See `clorch.cli` for the commands; this module decides, before anything is
composed, whether the command line is refused (a flag or Hydra key clorch
cannot check), whether this process is one rank of an outside launcher's job
(torchrun, srun, submitit), or whether Hydra runs it (help, a printed config,
a run, a sweep), checking every sweep combination first.
"""

from __future__ import annotations

import gc
import os
import sys
from typing import Any
from importlib import metadata

import hydra

from clorch._version import __version__
from clorch.cli import run_dir
from clorch.cli.hydra_app import CHECKED, remember_plan, run_hydra
from clorch.cli.hydra_flags import (
    MULTIRUN,
    OTHER_CONFIG,
    PRINT_CONFIG,
    PRINT_ONLY,
    flag_set,
    is_override,
    mode_errors,
    whole_flags,
)
from clorch.cli.hydra_keys import hydra_key_errors, touches_hydra
from clorch.cli.outcome import OUTCOME
from clorch.config.checks import print_config_errors
from clorch.config.composer import hydra_overrides, rewrite_recipe_overrides
from clorch.config.overrides import check_overrides, compose_once, grammar_errors, split_overrides
from clorch.plan.plan import config_errors, resolve_errors
from clorch.config.targets import trusted_modules
from clorch.engine.as_rank import run_as_rank
from clorch.engine.interrupts import Interrupted, interrupts_raise
from clorch.engine.outputs import typed_command
from clorch.engine.summary import record_interrupted_start
from clorch.launch.child import exit_without_finalizing
from clorch.launch.console import protect
from clorch.launch.external import detect as detect_external
from clorch.launch.torchrun import quiet_cpp_warnings
from clorch.status import Status
from clorch.sweep.checks import as_hydra_overrides, sweep_errors
from clorch.sweep.pool import start_server
from clorch.sweep.report import SWEEP_END
from clorch.plan.where import Machine, job_machine

EXIT_CONFIG = Status.CONFIG_ERROR.exit_code


def _versions() -> str:
    """One line with clorch's, torch's and Hydra's versions (read without importing torch)."""
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "not installed"
    return f"clorch {__version__} (torch {torch_version}, hydra-core {hydra.__version__})"


def train_main(argv: list[str] | None = None) -> int:
    """The `clorch-train` console script. Returns the exit status.

    Flags first (refusals, --version), then who runs the job: this process as one
    rank of an outside launcher, or Hydra (help, a printed config, a run, a sweep).

    Ctrl-C, SIGTERM or SIGHUP at any moment ends it with 128 + the signal and a
    `clorch-train: interrupted by ...` line, never a traceback; a run directory made
    by then is listed as interrupted (clorch.engine.summary.record_interrupted_start).
    One rank of an outside launcher's job keeps the signals' default actions until it
    trains (clorch.engine.as_rank): its launcher ends it by a signal, which must not
    wait for Python code to resume (a rank blocked in a rendezvous).
    """
    if _outside_launcher_rank():
        return _train_command(argv)
    try:
        with interrupts_raise():
            return _train_command(argv)
    except Interrupted as exc:  # before a run started, or after it ended (a run's own is reported there)
        print(f"clorch-train: {exc}", file=sys.stderr)
        return Status.INTERRUPTED.exit_code_after(exc.signum)


def _outside_launcher_rank() -> bool:
    """Whether this process looks like one rank of an outside launcher's job (malformed
    variables count as not: `_train_command` reports them)."""
    try:
        return detect_external() is not None
    except ValueError:
        return False


def _train_command(argv: list[str] | None) -> int:
    """train_main without its handling of signals."""
    typed = ["clorch-train", *(sys.argv[1:] if argv is None else argv)]
    given = typed[1:]
    overrides = [arg for i, arg in enumerate(given) if is_override(given, i)]
    flags, flag_errors = whole_flags([arg for i, arg in enumerate(given) if not is_override(given, i)])
    OUTCOME.argv[:] = [*overrides, *flags]
    names = flag_set(flags)
    if "--version" in names and not flag_errors:  # Hydra's own --version names only Hydra
        print(_versions())
        return 0
    refused = _refusals([*overrides, *flags], names, flag_errors)
    if refused:  # shown with the config's own errors, so that one try lists every error
        print_config_errors(refused + _errors_beside_refused(overrides, names))
        return EXIT_CONFIG
    try:
        overrides = rewrite_recipe_overrides(overrides)
        external = None if names & set(PRINT_ONLY + OTHER_CONFIG + PRINT_CONFIG + MULTIRUN) else detect_external()
    except ValueError as exc:  # a recipe path that does not exist, an override Hydra cannot parse
        print_config_errors(grammar_errors(overrides) or [str(exc)])
        return EXIT_CONFIG
    if external is not None:  # one rank of a torchrun / srun / submitit job: train as that rank
        OUTCOME.as_rank = True
        with typed_command(typed):
            return run_as_rank(overrides, external)
    if "--hydra-help" in names:  # about Hydra, not the job: composed without the job's config (Hydra's
        # own, config_name=None), which a recipe's group choices would not compose onto
        return run_hydra([*(o for o in overrides if touches_hydra(o)), *flags])
    if names & set(PRINT_ONLY):
        return run_hydra([*overrides, *flags])
    with typed_command(typed):  # env.json records the command as typed, for re-running it
        return _check_and_run(overrides, flags)


def _refusals(args: list[str], flags: set[str], flag_errors: list[str]) -> list[str]:
    """Flags, Hydra keys and output directories clorch-train refuses, before composing anything."""
    return (
        flag_errors
        + mode_errors(flags)
        + hydra_key_errors(args)
        + [
            f"{flag} is not supported by clorch-train: it would compose or load a config clorch cannot check "
            "first; put your settings in a recipe (+recipe=/path/to/file.yaml, or a folder on "
            "CLORCH_RECIPE_PATH)"
            for flag in sorted(flags & set(OTHER_CONFIG))
        ]
    )


def _check_and_run(overrides: list[str], flags: list[str]) -> int:
    """Check the config (every sweep combination in-process), then print it or run it with Hydra.

    `overrides` and `flags` as `is_override` and `whole_flags` read them; Hydra gets the
    overrides first.
    """
    names = flag_set(flags)
    multirun = bool(names & set(MULTIRUN))
    if multirun and not names & set(PRINT_CONFIG) and _trials_run_here(overrides):
        start_server()  # the trials' imports, while the sweep checks them (clorch.sweep.pool)
    errors = _errors_before_hydra(overrides, names, multirun)
    if errors:
        print_config_errors(errors)
        return EXIT_CONFIG
    if names & set(PRINT_CONFIG):
        _print_trusted()
        return run_hydra([*overrides, *flags])
    try:
        extra, created, footprint = run_dir.launch_overrides(overrides, multirun)
    except OSError as exc:  # the default outputs/ (or multirun/) cannot be made here
        layout, key = ("multirun", "hydra.sweep.dir") if multirun else ("outputs", "hydra.run.dir")
        print_config_errors(
            [
                f"cannot create the run directory {layout}/DATE/TIME under {os.getcwd()} "
                f"({exc.strerror or exc}); run from a writable directory or set {key}"
            ]
        )
        return EXIT_CONFIG
    OUTCOME.is_sweep = multirun
    footprint = None if multirun else footprint
    try:
        run_dir.hold(footprint)
        args = [*(as_hydra_overrides(overrides) if multirun else hydra_overrides(overrides)), *extra, *flags]
        return run_hydra(args, run_dir=footprint.path if footprint else None)
    except Interrupted as exc:  # before Hydra started the run (run_hydra records a later one)
        if footprint is not None:  # its directory, made or marked, is listed as interrupted
            record_interrupted_start(footprint.path, exc.signal_name)
        raise
    finally:
        run_dir.remove_refused(footprint, refused=OUTCOME.refused)
        run_dir.remove_if_empty(created)
        OUTCOME.is_sweep = False


def _trials_run_here(overrides: list[str]) -> bool:
    """Whether a sweep's trials run on this machine, forked by clorch.sweep.pool: Hydra's basic
    launcher (a launcher plugin, submitit's, starts its jobs elsewhere)."""
    chosen = [o.partition("=")[2] for o in overrides if o.partition("=")[0].lstrip("+~") == "hydra/launcher"]
    return all(value == "basic" for value in chosen)


def _errors_before_hydra(overrides: list[str], names: set[str], multirun: bool) -> list[str]:
    """The errors clorch-train finds before Hydra runs: every trial of a sweep, a printed config,
    a bad group choice. A single run is composed by Hydra and checked once, in its job.

    Every check reports the errors found without torch first, alone, before torch is imported
    (clorch.plan.plan): a typo is reported in a fraction of a second.
    """
    CHECKED.clear()
    if multirun:  # the sweep's keys, its search space and each trial's config (clorch.sweep.checks),
        # for the machine its jobs run on: a launcher plugin's nodes are checked by their ranks
        machine = job_machine(overrides)
        return sweep_errors(overrides, lambda trial: _planned(trial, machine), _composed)
    if names & set(PRINT_CONFIG) or split_errors(overrides):
        # A printed config gets the checks that import no torch (clorch.plan.plan.config_errors); a
        # bad group choice, which Hydra would not compose, every error in-process.
        return check_overrides(overrides, config_errors if names & set(PRINT_CONFIG) else remember_plan)
    return []


def _planned(overrides: list[str], machine: Machine) -> list[str]:
    """A trial's errors: every combination planned in-process for `machine` (its jobs on this
    machine take the plans made here)."""
    return check_overrides(overrides, lambda cfg: remember_plan(cfg, machine))


def split_errors(overrides: list[str]) -> list[str]:
    """The errors found without composing (bad group choices, recipe files, grammar)."""
    try:
        return split_overrides(overrides)[1]
    except Exception as exc:  # Hydra's grammar error: name each override it refuses
        return grammar_errors(overrides) or [str(exc).strip()]


def _composed(overrides: list[str]) -> Any:
    """The config one trial's overrides compose to (None: it does not compose)."""
    return compose_once(overrides)[0]


def _print_trusted() -> None:
    """Above a printed config: the modules trusted for `_target_`, as YAML comments (as config.yaml has)."""
    for where, names in trusted_modules().items():
        if names:
            print(f"# trusted modules ({where}): {', '.join(names)}")


def _errors_beside_refused(overrides: list[str], names: set[str]) -> list[str]:
    """The config errors of the overrides that were not refused (none of Hydra's keys).

    Composing them is safe: recipes may set no Hydra key (clorch.config.composer).
    """
    if names & set(OTHER_CONFIG):
        return []  # the user meant another config: clorch's errors would be beside the point
    overrides = [a for a in overrides if "=" in a and not touches_hydra(a)]
    try:
        overrides = rewrite_recipe_overrides(overrides)
        return check_overrides(overrides, resolve_errors)
    except ValueError as exc:  # a recipe path that does not exist, an override Hydra cannot parse
        return grammar_errors(overrides) or [str(exc)]


def main() -> None:
    protect()  # a closed pipe on the console must not end the run (clorch.launch.console)
    if detect_external() is None:  # the launching process (a rank of another launcher trains)
        quiet_cpp_warnings()  # a multi-node job's store teardown prints no C++ stack trace
    code = train_main()
    if SWEEP_END.ran_trials:  # a sweep's process: torch, Optuna and matplotlib imported and done with;
        # finalizing them takes a second or more and frees nothing the exit does not
        exit_without_finalizing(code)
    if OUTCOME.as_rank or OUTCOME.hosted_agent:
        # gloo's threads (a rank's), and the threads torch's elastic agent leaves behind in the
        # process that ran it (its rendezvous store's, once another node's agent hosting the
        # store has gone), can abort in interpreter finalization: SIGABRT after the report.
        exit_without_finalizing(code)
    # The collection at interpreter exit would scan all of torch, Hydra and matplotlib to free
    # nothing the exit does not (0.3-1 s of a short run); frozen, it skips them. See clorch._gc.
    gc.freeze()
    sys.exit(code)
