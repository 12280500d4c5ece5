"""The front door: a composed config becomes one checked, machine-resolved launch plan.

Every way of starting a run comes through here once: `clorch-train` (its Hydra
job, and every combination of a sweep before the sweep starts), `clorch.run_local`,
and each rank of an outside launcher (torchrun, srun, submitit), which has no
launching process of its own to check for it. `plan_or_errors(cfg, run_dir)`
makes relative paths absolute against the directory the user ran from,
resolves interpolations (one that does not resolve is an error naming its
key), checks the config against the schemas (clorch.config.checks), and adds
the errors that need the machine (nccl without GPUs, devices that do not
exist), the data's sizes (a batch larger than a rank's shard, an eval split
smaller than the job, a model sequence shorter than the samples), the
filesystem (directories the run cannot write) and the checkpoint to resume
(another model or batch size, a world size that cannot keep its global batch:
clorch.plan.resume; a resume onto another world size sets `accumulation` to
keep it, and the plan's description says so): all of them at once. The
dataset sizes come from `clorch.data.tasks.split_size`, without building the data.

The ranks receive the plan as a file: the checked objects, pickled, with their digest
(`clorch.plan.plan_file`: `write_plan`, `read_plan`, which builds nothing but clorch's config classes;
a worker of your own under `launcher=torchrun` gets `Plan.to_dict()` in its launch
arguments, see `clorch.train.worker.plan_of`) and do not check it again;
`for_world_size` adapts the step arithmetic (and the accumulation a resume
keeps) when an elastic rendezvous formed another world size than the plan's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Mapping

from omegaconf import DictConfig

from clorch._gc import import_long_lived
from clorch.config.checks import ConfigError, checked_partial, complete
from clorch.config.layout import ParallelLayout
from clorch.builders.data import is_user_data, split_sizes
from clorch.config.overrides import compose_once
from clorch.config.paths import with_absolute_paths
from clorch.plan.checks import (
    data_errors,
    drop_last,
    external_ranks,
    local_ranks,
    memory_errors,
    min_nodes,
    model_errors,
    node_errors,
    path_errors,
    plan_steps,
    plugin_ranks,
    rank_count_errors,
    schedule_errors,
    token_file_errors,
    top_backend,
)
from clorch.plan.machine import liger_errors, machine_errors
from clorch.plan.resume import ResumeFit, resume_fit
from clorch.plan.where import ANYWHERE, Machine
from clorch.plan.interrupted import reraise_interrupt
from clorch.config.schema import TrainConfig
from clorch.config.targets import trusted_modules
from clorch.plan.user_checks import init_from_errors, user_data_errors, user_model_errors


@dataclass(frozen=True)
class Plan:
    """What the config became on this machine; the ranks run exactly this."""

    config: TrainConfig  # the checked config
    backend: str  # "nccl" or "gloo"
    nproc_per_node: int  # ranks on this node
    devices: list[int] | None  # CUDA device indices, None for CPU ranks
    world_size: int  # ranks in the whole job
    # how the ranks are arranged (replicas, shard groups, the data-parallel ranks): what every part
    # that means "the data-parallel size" or "sharded" asks (`cfg.parallel.layout(world_size)`)
    layout: ParallelLayout
    device_type: str  # "cuda" or "cpu"
    train_size: int  # samples in the training split
    eval_size: int  # samples in the held-out split
    shard_size: int  # samples per rank per epoch
    steps_per_epoch: int  # optimizer steps per epoch
    total_steps: int  # optimizer steps in the run
    preflight: str = "false"  # "false", "true" (check the machines, then train) or "only"
    # the modules the person running the job trusted for `_target_`, by where each was named
    # (CLORCH_TRUSTED_MODULES, installed packages' entry points, register_target_prefix)
    trusted_modules: dict[str, list[str]] = field(default_factory=dict)
    # a resume onto another world size: how `accumulation` was set to keep the checkpoint's
    # global batch (clorch.plan.resume), one line for the console
    resume_note: str | None = None

    def describe(self) -> str:
        """One line for the user: where and how the job runs (and a second one, `resume_note`)."""
        where = (
            f"{self.nproc_per_node} CUDA rank(s) on devices {self.devices} over {self.backend}"
            if self.device_type == "cuda"
            else f"{self.nproc_per_node} CPU rank(s) over {self.backend} (no CUDA GPU visible)"
        )
        amp = self.config.precision.describe(self.device_type)
        nodes = f" x {self.world_size // self.nproc_per_node} nodes" if self.world_size > self.nproc_per_node else ""
        if self.preflight == "only":
            return f"clorch: preflight only, {where}{nodes}: checking the machines, no training"
        first = ""
        if self.preflight == "true":
            chosen = self.config.preflight.mode_for(nodes=1) == "true"  # set, not implied by the nodes
            first = (
                "preflight first"
                + ("" if chosen else " (the default on more than one node; preflight=false skips it)")
                + ", then "
            )
        note = f"\nclorch: {self.resume_note}" if self.resume_note else ""
        return (
            f"clorch: running {where}{nodes}, {amp}; {first}"
            f"{self.total_steps} steps of {self.steps_per_epoch} per epoch{note}"
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain values (env.json's plan, the digest, a torchrun rank's worker of your own);
        `from_dict` reverses it."""
        out = asdict(self)
        out["config"] = self.config.to_dict()
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "Plan":
        """The plan `to_dict` wrote (trusted: it was checked when it was made)."""
        config = TrainConfig.from_dict(dict(values["config"]))
        return cls(**{**values, "config": config, "layout": ParallelLayout(**values["layout"])})

    def digest(self) -> str:
        """sha256 of the plan's plain values: equal plans, equal digests."""
        return _digest(self.to_dict())


def _digest(values: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()


def _data_error(cfg: Any, exc: Exception, problems: list[str]) -> list[str]:
    """The data's own error as a config error, unless the checks already named its key."""
    if is_user_data(cfg):
        return [f"data._target_={cfg.data.target}: {exc}"]
    message = f"data={cfg.data.name}: {exc}".replace("text.path", "data.path")
    named = set(re.findall(r"data\.\w+", message))
    if any(p.split("=")[0].split(" ")[0] in named for p in problems):
        return []  # (a missing data.path is reported once, by the checks)
    return [message]


def _machine(
    cfg: Any, run_dir: Path | None, problems: list[str], external: Any, machine: Machine
) -> tuple[Any, Any, Any, Any]:
    """(world size, ranks per node, devices, backend), each None where the sections it needs have
    errors; adds the torch-free checks' errors (the ranks, the machine, the paths) to `problems`."""
    world = nproc = devices = backend = None
    problems += machine.problems
    if external is not None and complete(cfg, "top"):
        nproc, devices, backend = external_ranks(cfg, external, problems)
        world = external.env.world_size
    elif machine.tasks_per_node > 1 and top_backend(cfg) is not None:  # a launcher plugin's tasks
        nproc, devices, backend = plugin_ranks(top_backend(cfg), problems, machine)
        world = nproc * (machine.nodes or 1)
    elif complete(cfg, "launcher") and top_backend(cfg) is not None:
        nproc, devices, backend = local_ranks(cfg.launcher, top_backend(cfg), problems, machine)
        world = nproc * (machine.nodes or min_nodes(cfg.launcher.nnodes))
        problems += rank_count_errors(nproc, backend, machine) + node_errors(cfg.launcher)
    if world is not None:
        problems += machine_errors(cfg, backend, devices, machine)
    if complete(cfg, "checkpoint") and machine.software_here:
        problems += path_errors(cfg, run_dir)
    return world, nproc, devices, backend


def _layout(cfg: Any, world: int, problems: list[str]) -> ParallelLayout | None:
    """The `parallel` option's arrangement of `world` ranks, or None, adding why it cannot be made
    (a replicate degree that does not divide them, ...) to `problems`."""
    if not complete(cfg, "parallel"):
        return None
    errors = cfg.parallel.layout_errors(world)
    problems += errors
    return None if errors else cfg.parallel.layout(world)


def _sized_checks(
    cfg: Any, problems: list[str], layout: ParallelLayout, memory_nproc: int | None, backend: Any
) -> tuple[int, int] | None:
    """The train and eval split sizes (None where the data cannot be sized), adding the data's,
    the model's and, with `memory_nproc` ranks a node, the memory's errors to `problems`."""
    if not complete(cfg, "top", "data"):
        return None
    sizes = None
    try:
        import_long_lived("torch")  # the checks below import it: once, not rescanned (clorch._gc)
        sizes = split_sizes(cfg)
        if complete(cfg, "model"):
            problems += model_errors(cfg) + token_file_errors(cfg) + init_from_errors(cfg)
            if complete(cfg, "loss", "step"):
                problems += user_data_errors(cfg, layout) + user_model_errors(cfg, layout) + liger_errors(cfg)
            if memory_nproc is not None and not problems:
                problems += memory_errors(cfg, memory_nproc, backend)
    except (ValueError, TypeError, OSError) as exc:  # the task rejects its arguments
        problems += _data_error(cfg, exc, problems)
    except Exception as exc:  # a dataset of yours raised while being built
        reraise_interrupt(exc)
        problems.append(f"data._target_={cfg.data.target}: building it raised {type(exc).__name__}: {exc}")
    return sizes


def _memory_nproc(world: int | None, nproc: int | None, external: Any, machine: Machine) -> int | None:
    """The ranks a node whose memory is checked against this machine's, or None for no check.

    Only for clorch's own launcher's ranks on this machine: another launcher's ranks see free
    memory that differs from rank to rank, and a check that stops some ranks only leaves the
    others waiting."""
    here = world is not None and external is None and machine.hardware_here and machine.tasks_per_node == 1
    return nproc if here else None


def _resume(cfg: Any, layout: ParallelLayout, run_dir: Path | None, problems: list[str]) -> ResumeFit:
    """How the checkpoint the run resumes fits this job (nothing to resume: an empty fit), adding
    why it does not to `problems`."""
    fit = ResumeFit()
    if complete(cfg, "checkpoint", "model", "data", "optim"):
        fit = resume_fit(cfg, layout, run_dir)
        problems += fit.errors
    return fit


def _steps(cfg: Any, sizes: tuple[int, int], layout: ParallelLayout, problems: list[str]) -> tuple[int, int, int]:
    """(samples per rank per epoch, optimizer steps per epoch, steps in the run), adding the data's
    errors at these sizes and the schedule's errors at this length to `problems`."""
    problems += data_errors(cfg, *sizes, layout)
    shard, per_epoch, total = plan_steps(cfg, sizes[0], layout)
    if complete(cfg, "schedule"):
        problems += schedule_errors(cfg, total)
    return shard, per_epoch, total


def _build(
    cfg: Any,
    run_dir: Path | None,
    problems: list[str],
    external: Any = None,
    sized: bool = True,
    machine: Machine | None = None,
) -> Plan | None:
    """The plan, adding every error found to `problems`.

    `cfg` may be a `Partial` (some sections have errors): each check runs when the
    sections it reads are valid, so that every error is reported in one go. The checks
    that import no torch run first (the config's own, the ranks, the machine, the paths);
    when they found errors, those are reported alone, before torch is imported (a typo
    in a fraction of a second, not after seconds of imports and trials). With
    `sized=False` only they run (no data, model or resume checks) and no plan is made.
    """
    machine = Machine.here() if machine is None else machine
    world, nproc, devices, backend = _machine(cfg, run_dir, problems, external, machine)
    if problems or not sized:
        return None
    if (layout := _layout(cfg, world, problems)) is None:
        return None
    sizes = _sized_checks(cfg, problems, layout, _memory_nproc(world, nproc, external, machine), backend)
    if world is None or sizes is None or drop_last(cfg) is None:
        return None
    fit = _resume(cfg, layout, run_dir, problems)
    cfg = cfg if fit.accumulation is None else fit.applied(cfg)  # a checkpoint to resume keeps its global batch
    shard, per_epoch, total = _steps(cfg, sizes, layout, problems)
    if problems:
        return None
    return Plan(
        config=cfg,
        backend=backend,
        nproc_per_node=nproc,
        devices=devices,
        world_size=world,
        layout=layout,
        device_type="cuda" if backend == "nccl" else "cpu",
        train_size=sizes[0],
        eval_size=sizes[1],
        shard_size=shard,
        steps_per_epoch=per_epoch,
        total_steps=total,
        preflight=cfg.preflight.mode_for(nodes=max(1, world // max(1, nproc))),
        trusted_modules={k: v for k, v in trusted_modules().items() if v},
        resume_note=fit.note,
    )


def plan_or_errors(
    cfg: DictConfig | Mapping[str, Any] | TrainConfig,
    run_dir: str | os.PathLike | None = None,
    external: Any = None,
    base: str | os.PathLike | None = None,
    sized: bool = True,
    machine: Machine | None = None,
) -> tuple[Plan | None, list[str]]:
    """(the plan, or None, and every error: the config's, the machine's, the data's, the paths').

    `resolve`, with its errors returned instead of raised; the arguments are `resolve`'s.
    """
    try:
        return resolve(cfg, run_dir, base, external=external, sized=sized, machine=machine), []
    except ConfigError as exc:
        return None, exc.errors


def config_errors(cfg: DictConfig | Mapping[str, Any]) -> list[str]:
    """The errors found without torch and without building the data (what `--cfg job` checks).

    The config's own checks (keys, types, ranges, group choices, cross-key rules, the
    trust of every `_target_`), for whichever machine it is meant for
    (clorch.plan.where.ANYWHERE): what this machine lacks (GPUs for backend=nccl or
    precision=fp8, a package, a writable directory) is left to the run, so that a config
    composed on a laptop for a cluster prints. The data's sizes, the model against the
    data and the machine's memory, a forward pass of your own model and loss,
    `model.init_from` and the checkpoint to resume are left to `plan_or_errors`, which
    every run calls.
    """
    return plan_or_errors(cfg, sized=False, machine=ANYWHERE)[1]


def absolute(plan: Plan, base: str | os.PathLike) -> Plan:
    """The plan with its config's relative paths made absolute against `base` (no new checks:
    a path names the same file either way from `base`)."""
    return replace(plan, config=TrainConfig.from_dict(with_absolute_paths(plan.config.to_dict(), base)))


def config_key(cfg: DictConfig | Mapping[str, Any], base: str | os.PathLike | None = None) -> str | None:
    """A digest of the composed config as the door reads it (None: it does not resolve).

    Equal for the same composed config wherever it was composed, so that a sweep's jobs
    find the plans checked for them before the sweep started.
    """
    try:
        return _digest(with_absolute_paths(cfg, os.getcwd() if base is None else base))
    except ConfigError:
        return None


def check_run_dir(plan: Plan, run_dir: str | os.PathLike) -> Plan:
    """The checks of a plan made without a run directory that need one (the directory is
    writable, a reused one holds no other run's step checkpoints, the checkpoint a resume
    would take from it fits); then `plan` with the accumulation that keeps that checkpoint's
    global batch (`for_world_size`).

    Raises:
        ConfigError: every run-directory error.
    """
    run_dir = Path(run_dir)
    fitted, errors = for_world_size(plan, plan.world_size, run_dir)
    errors = path_errors(plan.config, run_dir) + errors
    if errors:
        raise ConfigError(errors)
    return fitted


def for_world_size(plan: Plan, world_size: int, run_dir: Path | None = None) -> tuple[Plan, list[str]]:
    """The plan as ranks that an elastic rendezvous gathered `world_size` strong run it.

    The config was checked when the plan was made; only what depends on the world
    size is computed (and checked: the shard against the batch, the eval split against
    the ranks, the checkpoint to resume and the accumulation that keeps its global batch,
    clorch.plan.resume) again. The same plan when neither the size nor the accumulation changes.
    """
    errors: list[str] = []
    layout = _layout(plan.config, world_size, errors)
    if layout is None:
        return plan, errors
    fit = resume_fit(plan.config, layout, run_dir)
    cfg = fit.applied(plan.config)
    if world_size == plan.world_size and cfg is plan.config:
        return plan, fit.errors
    errors = data_errors(cfg, plan.train_size, plan.eval_size, layout) + fit.errors
    shard, per_epoch, total = plan_steps(cfg, plan.train_size, layout)
    return replace(
        plan,
        config=cfg,
        world_size=world_size,
        layout=layout,
        shard_size=shard,
        steps_per_epoch=per_epoch,
        total_steps=total,
        resume_note=fit.note,
    ), errors


@contextlib.contextmanager
def run_errors_as_config_errors() -> Iterator[None]:
    """Report, as config errors naming their key, what stops a run at its start that a
    setting explains: another live job holding the checkpoint directory (checkpoint.dir).

    Raises:
        ConfigError: in place of clorch.checkpoint.locks.DirectoryInUse.
    """
    try:
        yield
    except Exception as exc:
        # Looked up, not imported: clorch.checkpoint.locks imports torch, which a config with
        # errors found before it never needs; and unless it was imported, it raised nothing.
        locks = sys.modules.get("clorch.checkpoint.locks")
        if locks is not None and isinstance(exc, locks.DirectoryInUse):
            raise ConfigError([f"checkpoint.dir: {exc}"]) from None
        raise


def plan_overrides(overrides: list[str], run_dir: str | os.PathLike | None = None) -> Plan:
    """Compose `overrides` as clorch-train would (Hydra keys aside) and resolve the plan.

    Raises:
        ConfigError: every composition and config error, together.
    """
    cfg, errors = compose_once([o for o in overrides if not o.partition("=")[0].lstrip("+~").startswith("hydra")])
    if cfg is not None:
        plan, found = plan_or_errors(cfg, run_dir)
        errors += [e for e in found if e not in errors]
    if errors:
        raise ConfigError(errors)
    return plan


def resolve_errors(cfg: DictConfig | Mapping[str, Any]) -> list[str]:
    """Every error `resolve` would raise (empty when the config runs here)."""
    return plan_or_errors(cfg)[1]


def resolve(
    cfg: DictConfig | Mapping[str, Any] | TrainConfig,
    run_dir: str | os.PathLike | None = None,
    base: str | os.PathLike | None = None,
    *,
    external: Any = None,
    sized: bool = True,
    machine: Machine | None = None,
) -> Plan | None:
    """Check `cfg` and resolve it into the launch plan for the machine its ranks run on.

    Args:
        cfg: a composed config (Hydra's, or clorch.config.composer's), or an already checked
            TrainConfig.
        run_dir: the run directory, checked for being writable (None: not checked).
        base: make relative paths absolute against this directory first (a Hydra job passes
            the one the user ran clorch-train from); None checks them as written, relative to
            the current directory (`absolute` makes the plan's paths absolute afterwards).
        external: a clorch.launch.external.ExternalRank: place the ranks as another launcher
            (torchrun, srun) did, instead of the launcher config and this machine.
        sized: False runs only the checks that import no torch (see `config_errors`), makes
            no plan and returns None.
        machine: where the ranks run (clorch.plan.where): None is this machine, as for
            `external`; a sweep's jobs that a Hydra launcher plugin submits run on its
            nodes (`job_machine`), whose hardware their ranks check there.

    Raises:
        ConfigError: every config, machine, data, path and resume error found, together.
    """
    if isinstance(cfg, TrainConfig):
        typed, problems = cfg, []
    else:
        typed, problems = checked_partial(cfg, base=base)
    plan = (
        None
        if typed is None
        else _build(typed, None if run_dir is None else Path(run_dir), problems, external, sized, machine)
    )
    if problems:
        raise ConfigError(problems)
    return plan
