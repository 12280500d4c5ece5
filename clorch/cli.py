"""`clorch-train`: compose (Hydra), validate, launch, report.

    clorch-train                                  a small default job
    clorch-train +recipe=ddp_bf16 optim.lr=3e-4   a recipe plus overrides
    clorch-train -m +recipe=ddp_bf16 optim.lr=1e-3,3e-4   a sweep
    clorch-train --help                           recipes, groups and the default config
    clorch-train +recipe=ddp_bf16 --cfg job       the composed config, checked like a run
    clorch-train --version                        clorch's, torch's and Hydra's versions

Each run gets a directory of its own, outputs/DATE/TIME (TIME-1, TIME-2, ...
when several runs start in the same second); sweeps get multirun/DATE/TIME.
A run composes its config once (Hydra), checks and resolves it once into the
launch plan (clorch.engine.resolve), and launches that. Every config error is
reported together, before anything launches, and the command exits with
status 2 (leaving no run directory behind); a failed job exits with 1.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra
from omegaconf import DictConfig

from clorch.config.checks import EXIT_STATUS as CONFIG_EXIT_STATUS, ConfigError, print_config_errors
from clorch.config.composer import CONFIG_PATH, rewrite_recipe_overrides
from clorch.config.hydra_flags import (MULTIRUN, OTHER_CONFIG, PRINT_CONFIG, PRINT_ONLY, flag_set,
                                        flags_first, whole_flags)
from clorch.launch.external import detect as detect_external

if TYPE_CHECKING:
    from clorch.engine.footprint import Footprint

EXIT_FAILED, EXIT_CONFIG = 1, CONFIG_EXIT_STATUS
_failures: list[str] = []
_config_failures: list[str] = []
_single_run_dir: list[Path] = []  # the directory made for a single run (removed on a config error)
_interrupted: list[int] = []  # the signal that interrupted a run, if one did
_argv: list[str] = []  # the command line's arguments, for the resume hint
_trained_as_rank: list[bool] = []  # this process was one rank of an external launcher's job


def _report(result: dict[str, Any]) -> None:
    summary, status = result["summary"], result["status"]
    if summary["status"] == "succeeded" and not summary["final"]:  # another node than rank 0's
        print(f"clorch-train: succeeded; this node's ranks finished, rank 0's node writes the metrics; "
              f"logs in {result['run_dir']}")
        return
    if summary["status"] == "succeeded":
        final = summary["final"]
        shown = ", ".join(f"{k} {v:.4g}" for k, v in final.items()
                          if k in ("loss", "eval_loss", "eval_exact") and v is not None)
        print(f"clorch-train: succeeded, {summary['steps']} steps, {shown}; outputs in {result['run_dir']}")
        return
    if summary["status"] == "interrupted":
        _report_interrupted(result)
        return
    from clorch.engine.run import describe_error

    error = status.get("error") or {}
    what = describe_error({**error, "rank": status.get("failed_rank")}, failed="failed first")
    print(f"clorch-train: job {summary['status']}: {what}; run directory {result['run_dir']}",
          file=sys.stderr)
    if error.get("traceback"):
        print(error["traceback"], file=sys.stderr)
    _failures.append(result["run_dir"])


def _report_interrupted(result: dict[str, Any]) -> None:
    import signal

    from clorch.engine.interrupts import resume_hint

    summary, run_dir, cfg = result["summary"], Path(result["run_dir"]), result["plan"].config
    step = (summary.get("final") or {}).get("step", 0)
    print(f"clorch-train: interrupted by {summary['interrupted_by']} after step {step} of "
          f"{summary['planned_steps']}; the ranks were stopped; outputs in {run_dir}", file=sys.stderr)
    print(f"clorch-train: {resume_hint(cfg, run_dir, _argv)}", file=sys.stderr)
    _interrupted.append(signal.Signals[summary["interrupted_by"]].value)
    _failures.append(str(run_dir))


@hydra.main(config_path=CONFIG_PATH, config_name="config", version_base=None)
def _train(cfg: DictConfig) -> None:
    """The Hydra job: one multi-rank run in Hydra's output directory."""
    from hydra.core.hydra_config import HydraConfig

    from clorch.engine.outputs import write_json
    from clorch.engine.run import execute

    from hydra.utils import get_original_cwd

    from clorch.engine.paths import with_absolute_paths

    run_dir = HydraConfig.get().runtime.output_dir
    try:
        cfg = with_absolute_paths(cfg, get_original_cwd())  # hydra.job.chdir may have moved us
        external = detect_external()
        if external is not None:  # one task of a submitit job (hydra/launcher=submitit_*): one rank
            from clorch.engine.as_rank import train_as_rank

            if train_as_rank(cfg, Path(run_dir), external) != 0:
                _failures.append(run_dir)
            return
        result = execute(cfg, run_dir)
    except ConfigError as exc:
        print_config_errors(exc.errors)
        _config_failures.append(run_dir)
        if not _single_run_dir:  # a sweep's job keeps its directory, with the reason
            write_json(Path(run_dir) / "summary.json", {"status": "config_error", "errors": exc.errors})
        return
    _report(result)
    if result["summary"]["status"] == "interrupted" and not _single_run_dir:
        # A sweep ends with its interrupted job: Hydra would otherwise start the next one.
        from clorch.engine.interrupts import Interrupted

        raise Interrupted(_interrupted[-1])


def _versions() -> str:
    """One line with clorch's, torch's and Hydra's versions (read without importing torch)."""
    from importlib import metadata

    from clorch._version import __version__

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "not installed"
    return f"clorch {__version__} (torch {torch_version}, hydra-core {hydra.__version__})"


def _sets(args: list[str], *keys: str) -> bool:
    """Whether an override in `args` sets one of `keys` or a key below it (`+`/`++`/`~` too)."""
    names = [a.split("=")[0].lstrip("+~") for a in args if not a.startswith("-")]
    return any(n == k or n.startswith((f"{k}.", f"{k}/")) for n in names for k in keys)


def _launch_overrides(args: list[str]) -> tuple[list[str], Path | None, Footprint | None]:
    """Hydra overrides that give this launch its own directory and no empty log file.

    Hydra names the directory after the current second and reuses it when it
    exists, so runs started in the same second would write into one directory.
    Unless the user chose one (hydra.run.dir, or hydra.sweep.dir for -m), the
    directory is created here, atomically, and handed to Hydra.

    Returns:
        (the overrides, the directory created here or None, the launch's Footprint or None
        when the directory is not known before Hydra resolves it).
    """
    import datetime as _dt

    from clorch.config.composer import format_value
    from clorch.engine.footprint import Footprint
    from clorch.engine.outputs import new_run_dir

    out, created = [], None
    multirun = bool(flag_set(args) & set(MULTIRUN))
    key, layout = ("hydra.sweep.dir", "multirun") if multirun else ("hydra.run.dir", "outputs")
    if not _sets(args, key):
        footprint = Footprint(Path(layout) / _dt.date.today().isoformat() / "new")  # the parents made
        created = new_run_dir(layout=layout)
        footprint.made(created)
        out.append(f"{key}={format_value(str(created))}")
    else:
        value = _value_of(args, key)
        footprint = Footprint(value) if value and "${" not in value else None
    if not _sets(args, "hydra/job_logging", "hydra.job_logging"):
        # The launching process rarely logs: open clorch-train.log on the first record only.
        out.append("++hydra.job_logging.handlers.file.delay=true")
    return out, created, footprint


def _value_of(args: list[str], key: str) -> str | None:
    """The value the last override of `key` in `args` sets (quotes removed), or None."""
    values = [a.partition("=")[2] for a in args if a.partition("=")[0].lstrip("+") == key]
    return values[-1].strip("'\"") if values else None


def _remove_if_empty(directory: Path | None) -> None:
    """Drop a directory made for a launch that Hydra never started (it is still empty)."""
    if directory is None:
        return
    try:
        directory.rmdir()  # fails, as wanted, once the run wrote anything
    except OSError:
        pass


def _remove_refused(footprint: Footprint | None) -> None:
    """Take back what a single run that its config errors stopped left on disk.

    Only what Hydra wrote (.hydra/, perhaps clorch-train.log) and the directories
    made for it: no run happened. Nothing, while another process uses the directory
    (another node of a job sharing it, or another run): those files may be its own.
    """
    if footprint is None:
        return
    if _config_failures and not footprint.undo():
        print(f"clorch-train: left {footprint.path} as it was: another process is using it (another "
              "node of the same job, or another run), and the files there may be its own", file=sys.stderr)
    footprint.release()


def _run_hydra(args: list[str]) -> int:
    """Run the Hydra app on `args` (as if they were the command line); return the exit status."""
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()  # preflight may have composed in-process
    from clorch.engine.sweep import last_statuses

    _failures.clear()
    _config_failures.clear()
    _interrupted.clear()
    last_statuses.clear()
    saved = sys.argv
    sys.argv = [saved[0] if saved else "clorch-train", *args]
    from clorch.engine.interrupts import Interrupted, interrupts_raise

    try:
        with interrupts_raise():
            _train()
    except Interrupted as exc:  # between a sweep's jobs, or while Hydra starts one
        print(f"clorch-train: {exc}", file=sys.stderr)
        return 128 + exc.signum
    except SystemExit as exc:  # Hydra exits after --help and on its own errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_FAILED)
    finally:
        sys.argv = saved
    return _exit_status()


def _exit_status() -> int:
    """0 when every job succeeded; 2 when config errors alone stopped some; 128 + the signal
    when one interrupted the run (as a shell reports it); else 1."""
    from clorch.engine.sweep import last_statuses

    if _interrupted:
        return 128 + _interrupted[0]
    failed = bool(_failures) or any(s not in ("succeeded", "config_error") for s in last_statuses)
    config = bool(_config_failures) or "config_error" in last_statuses
    if config and not failed:
        return EXIT_CONFIG
    return EXIT_FAILED if failed or config else 0


def train_main(argv: list[str] | None = None) -> int:
    """The `clorch-train` console script. Returns the exit status.

    Flags first (refusals, --version), then who runs the job: this process as one
    rank of an outside launcher, or Hydra (help, a printed config, a run, a sweep).
    """
    args, flag_errors = whole_flags(list(sys.argv[1:] if argv is None else argv))
    args = flags_first(args)
    _argv[:] = args
    flags = flag_set(args)
    if "--version" in flags and not flag_errors:  # Hydra's own --version names only Hydra
        print(_versions())
        return 0
    refused = _refusals(args, flags, flag_errors)
    if refused:  # shown with the config's own errors, so that one try lists every error
        print_config_errors(refused + _errors_beside_refused(args, flags))
        return EXIT_CONFIG
    try:
        args = rewrite_recipe_overrides(args)
        external = None if flags & set(PRINT_ONLY + OTHER_CONFIG + PRINT_CONFIG + MULTIRUN) \
            else detect_external()
    except ValueError as exc:  # a recipe path that does not exist, an override Hydra cannot parse
        from clorch.config.preflight import grammar_errors

        print_config_errors(grammar_errors(a for a in args if not a.startswith("-")) or [str(exc)])
        return EXIT_CONFIG
    if external is not None:  # one rank of a torchrun / srun / submitit job: train as that rank
        from clorch.engine.as_rank import run_as_rank

        _trained_as_rank.append(True)
        return run_as_rank([a for a in args if not a.startswith("-")], external)
    if flags & set(PRINT_ONLY):
        return _run_hydra(args)
    return _check_and_run(args, flags)


def _refusals(args: list[str], flags: set[str], flag_errors: list[str]) -> list[str]:
    """Flags, Hydra keys and output directories clorch-train refuses, before composing anything."""
    from clorch.config.hydra_keys import hydra_key_errors

    return flag_errors + hydra_key_errors(args) + [
        f"{flag} is not supported by clorch-train: it would compose or load a config clorch cannot check "
        "first; put your settings in a recipe (+recipe=/path/to/file.yaml, or a folder on "
        "CLORCH_RECIPE_PATH)" for flag in sorted(flags & set(OTHER_CONFIG))]


def _check_and_run(args: list[str], flags: set[str]) -> int:
    """Check the config (every sweep combination in-process), then print it or run it with Hydra."""
    from clorch.config.preflight import hydra_overrides, preflight
    from clorch.engine.resolve import resolve_errors

    overrides = [a for a in args if "=" in a and not a.startswith("-")]
    multirun = bool(flags & set(MULTIRUN))
    if multirun or flags & set(PRINT_CONFIG) or split_errors(overrides):
        # A sweep, a printed config or a bad group choice: compose and check in-process first
        # (every combination, every error). A single run is composed by Hydra and checked once.
        errors = preflight(overrides, resolve_errors)
        if errors:
            print_config_errors(errors)
            return EXIT_CONFIG
    if flags & set(PRINT_CONFIG):
        return _run_hydra(args)
    try:
        extra, created, footprint = _launch_overrides(args)
    except OSError as exc:  # the default outputs/ (or multirun/) cannot be made here
        layout = "multirun" if multirun else "outputs"
        key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
        print_config_errors([f"cannot create the run directory {layout}/DATE/TIME under {os.getcwd()} "
                             f"({exc.strerror or exc}); run from a writable directory or set {key}"])
        return EXIT_CONFIG
    _single_run_dir[:] = [] if multirun else [created]
    _hold(footprint if not multirun else None)
    try:
        return _run_hydra([*(args if multirun else hydra_overrides(args)), *extra])
    finally:
        _remove_refused(footprint if not multirun else None)
        _remove_if_empty(created)
        _single_run_dir.clear()


def _hold(footprint: Footprint | None) -> None:
    """Mark the run directory as in use by this launch before Hydra writes there, so that
    a launch refused meanwhile (another node, another run) leaves this one's files alone."""
    if footprint is None:
        return
    try:
        footprint.hold()
    except OSError:
        pass  # Hydra cannot write there either, and says why; without the mark undo removes nothing


def _errors_beside_refused(args: list[str], flags: set[str]) -> list[str]:
    """The config errors of the overrides that were not refused (none of Hydra's keys).

    Composing them is safe: recipes may set no Hydra key (clorch.config.composer).
    """
    from clorch.config.hydra_keys import touches_hydra
    from clorch.config.preflight import grammar_errors, preflight
    from clorch.engine.resolve import resolve_errors

    if flags & set(OTHER_CONFIG):
        return []  # the user meant another config: clorch's errors would be beside the point
    overrides = [a for a in args if "=" in a and not a.startswith("-") and not touches_hydra(a)]
    try:
        overrides = rewrite_recipe_overrides(overrides)
        return preflight(overrides, resolve_errors)
    except ValueError as exc:  # a recipe path that does not exist, an override Hydra cannot parse
        return grammar_errors(overrides) or [str(exc)]


def split_errors(overrides: list[str]) -> list[str]:
    """The errors found without composing (bad group choices, recipe files, grammar)."""
    from clorch.config.preflight import grammar_errors, split_overrides

    try:
        return split_overrides(overrides)[1]
    except Exception as exc:  # Hydra's grammar error: name each override it refuses
        return grammar_errors(overrides) or [str(exc).strip()]



def main() -> None:
    code = train_main()
    if _trained_as_rank:
        from clorch.launch.child import exit_without_finalizing

        exit_without_finalizing(code)  # gloo's threads can abort in interpreter finalization
    sys.exit(code)


if __name__ == "__main__":
    main()
