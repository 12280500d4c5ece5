"""Running a sweep: what clorch's Hydra sweepers (hydra_plugins.clorch_sweepers) do in `sweep()`.

Hydra hands the sweeper its composed config, its launcher and the command line's
job overrides; `run_sweep` reads the sweep from them (clorch.sweep.checks, the
same reading `clorch-train` checked before anything started), picks the runner
(trials side by side with n_jobs > 1 under Hydra's basic launcher; through
Hydra's launcher otherwise) and the source (the grid, or an Optuna study), and
runs the trials (clorch.sweep.driver). sweep_summary.csv/.md, the best trial and
the plots are written when Hydra's multirun ends (clorch.sweep.report).

Before anything is written into the sweep directory, the sweep takes its lock and
checks that the directory holds no other sweep (clorch.sweep.directory); a sweep
refused there, or whose study's storage cannot be used, says why in a line and
runs nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from clorch.config.checks import ConfigError
from clorch.config.composer import format_value
from clorch.engine.results import RunSummary
from clorch.status import Status
from clorch.sweep import report
from clorch.sweep._private_apis import grid_combinations, runs_in_process
from clorch.sweep.checks import Sweep, read_sweep
from clorch.sweep.directory import SweepIdentity, SweepLock, check_identity
from clorch.sweep.errors import StorageError, SweepRefused
from clorch.sweep.driver import (
    RESUME,
    UNFINISHED,
    HydraRunner,
    PoolRunner,
    TrialSpec,
    run_trials,
    say,
    summary_in,
    writes_checkpoints,
)
from clorch.sweep.gpu_share import trials_per_gpu
from clorch.sweep.slots import machine, plan_slots, ranks_per_trial
from clorch.trackers import sweep_environ

# The Hydra overrides a side-by-side trial (a clorch-train process of its own) takes over.
TRIAL_HYDRA_KEYS = ("hydra.job.chdir", "hydra.job.name", "hydra.verbose", "hydra/job_logging", "hydra/hydra_logging")


class GridSource:
    """The grid's combinations in Hydra's order; a combination that ended before is kept."""

    def __init__(self, jobs: list[list[str]], sweep_dir: Path) -> None:
        self.todo: list[TrialSpec] = []
        kept = 0
        for number, job in enumerate(jobs):
            run_dir = sweep_dir / str(number)
            status = summary_in(run_dir).status if run_dir.is_dir() else None
            if status is not None and status not in UNFINISHED:
                kept += 1
                continue
            resume = status is not None and writes_checkpoints(run_dir)
            self.todo.append(TrialSpec(number, [*job, *([RESUME] if resume else [])], label=" ".join(job)))
        if kept:
            say(f"continuing the sweep in {sweep_dir}: {kept} of {len(jobs)} trial(s) ended before, kept")

    def next(self) -> TrialSpec | None:
        return self.todo.pop(0) if self.todo else None

    def ended(self, spec: TrialSpec, summary: RunSummary) -> None:
        pass


def grid_jobs(arguments: list[str], params: dict[str, str] | None) -> list[list[str]]:
    """Every combination of the grid, in the order Hydra's basic sweeper runs them."""
    lines = [f"{k}={v}" for k, v in (params or {}).items()] + list(arguments)
    return grid_combinations(OverridesParser.create().parse_overrides(lines))


def _trial_hydra_args(hydra_overrides: list[str]) -> list[str]:
    return [a for a in hydra_overrides if a.partition("=")[0].lstrip("+") in TRIAL_HYDRA_KEYS]


def _pool(config: DictConfig, sweep: Sweep, trial_lists: list[list[str]], sweep_dir: Path) -> PoolRunner:
    """Slots for n_jobs trials at once, up to trials_per_gpu of them on each GPU (clorch.sweep.gpu_share)."""
    gpus, cores = machine()
    n_jobs = sweep.settings.n_jobs
    per_gpu, line = trials_per_gpu(sweep.settings.trials_per_gpu, trial_lists, gpus) if n_jobs > 1 else (1, None)
    ranks = ranks_per_trial((config.get("launcher") or {}).get("nproc_per_node"), n_jobs, gpus, cores, per_gpu)
    if line is not None:
        held = max(1, len(gpus) * per_gpu // ranks)
        say(line + (f"; n_jobs={n_jobs} runs {held} at once" if held < n_jobs else ""))
        n_jobs = min(n_jobs, held)
    slots = plan_slots(n_jobs, ranks, gpus, cores, per_gpu)
    return PoolRunner(slots, sweep_dir, _trial_hydra_args(list(config.hydra.overrides.hydra)))


def _trial_lists(sweep: Sweep, arguments: list[str]) -> list[list[str]]:
    """Trials whose plans stand for the sweep's (the space's representative values, or the grid's first)."""
    if sweep.sweeper == "optuna":
        return sweep.space.representative_overrides()
    return grid_jobs(arguments, sweep.settings.params)[:8]


def _runner(config: DictConfig, launcher: Any, sweep: Sweep, arguments: list[str], sweep_dir: Path) -> Any:
    """Trials forked from the pool's warm server wherever Hydra's launcher would run them in this
    process (one at a time, too: a trial then pays no interpreter start and no torch import);
    a launcher plugin's jobs (submitit) through that launcher."""
    if runs_in_process(launcher):
        auto = sweep.settings.trials_per_gpu == "auto"  # only `auto` plans trials to size the GPUs' share
        return _pool(config, sweep, _trial_lists(sweep, arguments) if auto else [], sweep_dir)
    return HydraRunner(launcher, sweep_dir, sweep.settings.n_jobs)


class _TrackedSource:
    """Every trial with the environment the sweep's trackers give it (clorch.trackers.sweep_environ)."""

    def __init__(self, source: Any, env: dict[str, str]) -> None:
        self.source, self.env = source, env

    def next(self) -> TrialSpec | None:
        spec = self.source.next()
        return None if spec is None else TrialSpec(spec.number, spec.overrides, {**self.env, **spec.env}, spec.label)

    def ended(self, spec: TrialSpec, summary: RunSummary) -> None:
        self.source.ended(spec, summary)


def _run_tracked(config: DictConfig, source: Any, runner: HydraRunner | PoolRunner, sweep_dir: Path) -> None:
    """Run the trials under the sweep's MLflow parent run or W&B group, closed however the sweep ends."""
    logger = config.get("logger")
    env, close = sweep_environ(OmegaConf.to_container(logger, resolve=True) if logger else {}, sweep_dir)
    status = "failed"
    try:
        # Side by side, the trials' own lines are in their console.log: the sweep says how each ended.
        show_ends = isinstance(runner, PoolRunner) and runner.pool.own_consoles
        run_trials(_TrackedSource(source, env), runner, show_ends=show_ends)
        status = "completed"
    except KeyboardInterrupt:  # Ctrl-C, or clorch's Interrupted (SIGTERM, SIGHUP)
        status = "interrupted"
        raise
    finally:
        close(status)


def _described(param: Any) -> str:
    """A searched key's space, as sweep.json records it (the same however it was quoted)."""
    if param.kind == "choice":
        return "choice(" + ", ".join(format_value(v) for v in param.choices) + ")"
    kind = "int " if param.kind == "int" else ""
    if param.step is not None:
        return f"{kind}range({param.low}, {param.high}, step {param.step})"
    return f"{kind}{'log ' if param.log else ''}interval({param.low}, {param.high})"


def identity_of(sweep: Sweep, arguments: list[str], sweep_dir: Path) -> SweepIdentity:
    """What makes this sweep the same sweep when it is continued (clorch.sweep.directory)."""
    settings = sweep.settings
    if sweep.sweeper == "basic":
        lines = [f"{k}={v}" for k, v in (settings.params or {}).items()] + list(arguments)
        return SweepIdentity("basic", {a.partition("=")[0].lstrip("+~"): a.partition("=")[2] for a in lines})
    from clorch.sweep.storage import study_name  # lazy: Optuna only for its sweeper

    fixed = {a.partition("=")[0].lstrip("+~"): a.partition("=")[2] for a in sweep.space.fixed}
    searched = {p.key: _described(p) for p in sweep.space.params}
    study = {"name": study_name(settings, sweep_dir), "storage": settings.storage}
    return SweepIdentity("optuna", {**fixed, **searched}, settings.objective, settings.direction, study)


def _source(sweep: Sweep, arguments: list[str], sweep_dir: Path, uid: str) -> Any:
    if sweep.sweeper == "optuna":
        from clorch.sweep.study import StudySource  # lazy: Optuna only for its sweeper

        return StudySource(sweep.settings, sweep.space, sweep_dir, uid)
    return GridSource(grid_jobs(arguments, sweep.settings.params), sweep_dir)


def _start(config: DictConfig, sweep: Sweep, arguments: list[str], sweep_dir: Path) -> Any:
    """The sweep's source of trials, once its directory is its own (its lock taken, its identity
    checked and recorded). Raises SweepRefused, or StorageError (the study's storage)."""
    identity = identity_of(sweep, arguments, sweep_dir)
    changes = check_identity(sweep_dir, identity, sweep.settings.continue_changed)
    if changes:
        say(
            f"continuing the sweep in {sweep_dir} with changes, as hydra.sweeper.continue_changed asks: "
            f"{'; '.join(changes)}"
        )
    OmegaConf.save(config, sweep_dir / "multirun.yaml")
    return _source(sweep, arguments, sweep_dir, identity.uid)


def run_sweep(config: DictConfig, launcher: Any, arguments: list[str]) -> None:
    """Run the sweep that `config` (Hydra's multirun config) and its overrides describe.

    A sweep refused before its first trial (its directory in use or holding another sweep,
    its study another sweep's or lost, its storage unusable) says why and runs nothing;
    one whose storage fails during the trials stops its running trials and says why:
    either way clorch.sweep.report records how it ended (the exit status).

    Raises:
        ConfigError: the sweep's keys or space are wrong (clorch-train checked them before;
            this is for a sweep started another way).
        Interrupted: a signal stopped the sweep (its running trials were stopped first).
    """
    sweep, errors = read_sweep([*arguments, *config.hydra.overrides.hydra])
    if errors:
        raise ConfigError(errors)
    sweep_dir = Path(str(config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    lock = SweepLock(sweep_dir)
    try:
        lock.acquire()
        report.hold_until_summarized(lock)  # released once the summary is written, or here on an error
        source = base = _start(config, sweep, arguments, sweep_dir)
    except SweepRefused as exc:
        return report.refused(exc.errors)
    except StorageError as exc:
        return report.refused([str(exc)], Status.FAILED)
    except BaseException:
        lock.release()
        raise
    try:
        runner = _runner(config, launcher, sweep, arguments, sweep_dir)
        if isinstance(runner, PoolRunner) and sweep.settings.n_jobs > 1:
            # Each trial's ranks and accumulation are its slot's (clorch.sweep.pool: the global batch kept).
            say(f"running {sweep.settings.n_jobs} trials at once, each on its own slot; consoles in {sweep_dir}/N/")
        report.SWEEP_END.ran_trials = True
        _run_tracked(config, source, runner, sweep_dir)
    except (StorageError, SweepRefused, ValueError) as exc:  # ValueError: the GPUs' share (gpu_share)
        report.failed(str(exc))
    finally:
        getattr(base, "close", lambda: None)()  # the study's heartbeats
