"""The plan of a resume onto another world size: the accumulation that keeps the checkpoint's
global batch, the line that says so, and what is refused before launch.

The checkpoints are real ones (`save_checkpoint`, `save_sharded` in this process) whose
state holds the run record a run of the named world size writes (`run_record`): the plan
reads nothing else of them. The runs themselves: tests/engine/test_reshard_resume.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from clorch.checkpoint import save_checkpoint, step_checkpoint_path
from clorch.checkpoint.sharded import save_sharded, sharded_step_path
from clorch.config import compose
from clorch.config.checks import ConfigError
from clorch.plan.plan import check_run_dir, for_world_size, plan_or_errors, resolve
from clorch.plan.resume import RECORD_KEY, run_record

pytestmark = pytest.mark.timeout(120)

# 96 training samples in micro-batches of 8.
JOB = ["+recipe=cpu_smoke", "data.sample_count=96", "batch_size=8", "epochs=2"]


@pytest.fixture(autouse=True)
def _first_start(monkeypatch):
    for name in ("CLORCH_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)


def _plan(*overrides: str, run_dir: Path | None = None):
    plan, errors = plan_or_errors(compose([*JOB, *overrides]), run_dir)
    return plan, errors


def _checkpoint(path: Path, world_size: int, *overrides: str, record: bool = True) -> Path:
    """A checkpoint whose run record says a run of `world_size` ranks and `overrides` wrote it."""
    cfg = resolve(compose([*JOB, *overrides])).config
    state = {"step": 2, "epoch": 0}
    if record:
        state[RECORD_KEY] = run_record(cfg, world_size)
    model = torch.nn.Linear(2, 2)
    if path.suffix == ".dcp":
        return save_sharded(path, model=model, state=state)
    return save_checkpoint(path, model=model, state=state)


def _has(errors: list[str], *parts: str) -> bool:
    return any(all(p in e for p in parts) for e in errors)


def test_fewer_ranks_double_the_accumulation_and_keep_the_steps(tmp_path):
    path = _checkpoint(tmp_path / "two.ckpt", 2)
    before, _ = _plan("launcher.nproc_per_node=2")
    plan, errors = _plan("launcher.nproc_per_node=1", f"checkpoint.resume={path}")
    assert errors == []
    assert plan.config.accumulation == 2 and plan.world_size == 1
    line = "resume: world size 2 -> 1, accumulation 1 -> 2 keeps the global batch of 16"
    assert plan.resume_note == line
    assert plan.describe().splitlines()[1] == f"clorch: {line}"
    # Plan.for_world_size's arithmetic: the same steps an epoch and in the run.
    assert (plan.steps_per_epoch, plan.total_steps) == (before.steps_per_epoch, before.total_steps) == (6, 12)


def test_more_ranks_take_fewer_micro_batches(tmp_path):
    path = _checkpoint(tmp_path / "one.ckpt", 1, "accumulation=4")  # a global batch of 32
    plan, errors = _plan("launcher.nproc_per_node=2", f"checkpoint.resume={path}")
    assert errors == [] and plan.config.accumulation == 2
    assert plan.resume_note == "resume: world size 1 -> 2, accumulation 4 -> 2 keeps the global batch of 32"


def test_the_same_world_size_takes_the_checkpoints_accumulation(tmp_path):
    path = _checkpoint(tmp_path / "two.ckpt", 2, "accumulation=2")
    plan, errors = _plan("launcher.nproc_per_node=2", f"checkpoint.resume={path}")
    assert errors == [] and plan.config.accumulation == 2
    assert plan.resume_note == "resume: accumulation=1 -> 2, the checkpoint's, keeps its global batch of 32"
    same, _ = _plan("launcher.nproc_per_node=2", "accumulation=2", f"checkpoint.resume={path}")
    assert same.resume_note is None and same.describe().count("\n") == 0


def test_a_world_size_that_cannot_keep_the_global_batch_is_refused(tmp_path):
    path = _checkpoint(tmp_path / "two.ckpt", 2, "accumulation=3")  # 8 x 2 x 3 = 48
    plan, errors = _plan("launcher.nproc_per_node=4", f"checkpoint.resume={path}")
    assert plan is None
    assert _has(
        errors,
        f"checkpoint.resume={path}: the checkpoint was trained with the global batch 48 = batch_size 8 x 2 ranks "
        "x accumulation 3, which",
        "this job's 4 ranks (launcher.nproc_per_node) cannot keep: 48 is not a multiple of batch_size 8 x 4 = 32",
        "(1, 2, 3, 6 ranks), or start afresh (checkpoint.resume=none)",
    ), errors


def test_another_batch_size_is_refused_with_the_one_that_fits(tmp_path):
    path = _checkpoint(tmp_path / "two.ckpt", 2, "batch_size=16")  # 16 x 2 x 1 = 32
    _, errors = _plan("launcher.nproc_per_node=1", f"checkpoint.resume={path}")
    assert _has(
        errors,
        "batch_size=8 but the checkpoint was trained with batch_size=16",
        "keep batch_size=16 (on 1 rank accumulation then becomes 2)",
    ), errors


def test_a_checkpoint_without_its_batch_is_refused_on_another_world_size(tmp_path):
    path = _checkpoint(tmp_path / "mine.ckpt", 1, record=False)  # saved by one process, no run record
    assert _plan("launcher.nproc_per_node=1", f"checkpoint.resume={path}")[1] == []
    _, errors = _plan("launcher.nproc_per_node=2", f"checkpoint.resume={path}")
    assert _has(errors, "was written by 1 rank, this job has 2", "resume with 1 ranks"), errors


def test_a_checkpoint_of_the_other_parallel_option_is_refused(tmp_path):
    sharded = _checkpoint(tmp_path / "step.dcp", 2)
    _, errors = _plan(f"checkpoint.resume={sharded}")
    assert _has(errors, f"checkpoint.resume={sharded}: a sharded checkpoint", "resume it with parallel=fsdp"), errors
    whole = _checkpoint(tmp_path / "whole.ckpt", 2)
    _, errors = _plan("parallel=fsdp", f"checkpoint.resume={whole}")
    assert _has(errors, f"checkpoint.resume={whole}: a checkpoint file", "resume it with parallel=ddp"), errors
    plan, errors = _plan("parallel=fsdp", "launcher.nproc_per_node=1", f"checkpoint.resume={sharded}")
    assert errors == [] and plan.config.accumulation == 2


def test_resume_latest_is_planned_with_the_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    _checkpoint(step_checkpoint_path(run_dir / "checkpoints", 4), 2)
    plan, errors = _plan("launcher.nproc_per_node=1", "checkpoint.resume=latest", run_dir=run_dir)
    assert errors == [] and plan.config.accumulation == 2
    # A sweep's plan is made before its run directory exists; the directory's check adjusts it.
    early, errors = _plan("launcher.nproc_per_node=1", "checkpoint.resume=latest")
    assert errors == [] and early.config.accumulation == 1 and early.resume_note is None
    late = check_run_dir(early, run_dir)
    assert late.config.accumulation == 2 and late.resume_note == plan.resume_note
    newest = step_checkpoint_path(run_dir / "checkpoints", 4)
    with pytest.raises(ConfigError, match=rf"checkpoint.resume=latest \({newest}\): .* cannot keep"):
        check_run_dir(_plan("launcher.nproc_per_node=3", "checkpoint.resume=latest")[0], run_dir)


def test_an_elastic_restart_on_another_world_size_keeps_the_jobs_global_batch(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    plan, _ = _plan("launcher.nproc_per_node=2", "checkpoint=periodic", "checkpoint.resume=none")
    assert for_world_size(plan, 1, run_dir)[0].config.accumulation == 1  # no checkpoint yet: a fresh start
    _checkpoint(step_checkpoint_path(run_dir / "checkpoints", 4), 2)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # the rendezvous formed 1 rank, then 4
    smaller, errors = for_world_size(plan, 1, run_dir)
    assert errors == [] and smaller.config.accumulation == 2 and smaller.world_size == 1
    assert (smaller.steps_per_epoch, smaller.total_steps) == (plan.steps_per_epoch, plan.total_steps)
    assert smaller.resume_note == "resume: world size 2 -> 1, accumulation 1 -> 2 keeps the global batch of 16"
    same, errors = for_world_size(plan, 2, run_dir)
    assert same is plan and errors == []
    _, errors = for_world_size(plan, 4, run_dir)
    assert _has(errors, "cannot keep: 16 is not a multiple of batch_size 8 x 4 = 32"), errors


def test_sharded_latest_is_the_newest_committed_directory(tmp_path):
    run_dir = tmp_path / "run"
    _checkpoint(sharded_step_path(run_dir / "checkpoints", 2), 2, "accumulation=2")
    # A save that never committed: save_sharded writes beside the checkpoint and renames at the end,
    # so a kill leaves its hidden temporary directory (a step_N.dcp without clorch.json is refused).
    newer = sharded_step_path(run_dir / "checkpoints", 6)
    (newer.parent / f".{newer.name}.0123abcd.tmp").mkdir()
    plan, errors = _plan("parallel=fsdp", "launcher.nproc_per_node=1", "checkpoint.resume=latest", run_dir=run_dir)
    assert errors == [] and plan.config.accumulation == 4


def test_resume_latest_with_nothing_to_resume_says_so(tmp_path):
    """A misspelt checkpoint.dir is not a silent fresh start: the plan's description names it."""
    missing = tmp_path / "checkpoint"
    args = [
        "checkpoint=periodic",
        "checkpoint.every_n_steps=2",
        f"checkpoint.dir={missing}",
        "checkpoint.resume=latest",
    ]
    plan, errors = _plan(*args)
    assert errors == [] and plan.resume_note.startswith("checkpoint.resume=latest: nothing to resume: ")
    assert f"{missing} does not exist" in plan.resume_note and plan.resume_note.endswith("starts from step 0")
    assert f"clorch: {plan.resume_note}" in plan.describe()
    missing.mkdir()
    assert f"no step checkpoint in {missing};" in _plan(*args)[0].resume_note


def test_resume_latest_checks_the_checkpoint_the_ranks_fall_back_to_when_the_newest_is_damaged(tmp_path):
    run_dir = tmp_path / "run"
    older = _checkpoint(step_checkpoint_path(run_dir / "checkpoints", 4), 2)  # written by 2 ranks
    step_checkpoint_path(run_dir / "checkpoints", 8).write_bytes(b"not a checkpoint")  # cut off mid-write
    plan, errors = _plan("launcher.nproc_per_node=1", "checkpoint.resume=latest", run_dir=run_dir)
    # the ranks skip step 8 for step 4: the plan keeps step 4's global batch on one rank
    assert errors == [] and plan.config.accumulation == 2
    assert plan.resume_note == "resume: world size 2 -> 1, accumulation 1 -> 2 keeps the global batch of 16"
    with pytest.raises(ConfigError, match=rf"checkpoint.resume=latest \({older}\): .* cannot keep"):
        check_run_dir(_plan("launcher.nproc_per_node=3", "checkpoint.resume=latest")[0], run_dir)
