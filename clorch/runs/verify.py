"""`clorch-runs verify RUN [--steps K]`: rerun a run and say whether its weights come out bit-identical.

Whole (no `--steps`): the run must have finished (summary.json's `weights_sha256`); the
rerun (clorch.runs.rerun: its recorded command, into a temporary directory) runs to its
end, and the two digests are compared.

At step K (`--steps K`): the run's own checkpoint of step K against the rerun's. The rerun
is not given `max_steps=K`: the planned number of steps sets the learning-rate schedule
(a cosine decay's length, a warm-up's fraction), so a run cut short that way is another
run, whose step K need not be the run's. The rerun keeps the run's config and its
checkpoint policy, so it writes its checkpoint of step K at the same point of the same
training, and is stopped once it has. Each checkpoint's weights are digested by the very
function that computes summary.json's `weights_sha256` (`clorch.strategies.weights_digest`)
over the model state dict the checkpoint holds (rank 0's model.state_dict(), whole):
a run's last step checkpoint has its `weights_sha256`. Sharded checkpoints
(parallel=fsdp, `step_K.dcp/`) are not read: verify such a run whole.

When the weights differ, the environments are compared (clorch.runs.environment:
torch, CUDA, GPU models, clorch's version and commit, Python, world size, each data
file's digest), and whether the run was `exact=true` is said: without it a run repeats
itself on its own layout, but a GPU's non-deterministic kernels need not.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from clorch._checkpoint_names import step_checkpoint_path
from clorch.runs.commands import checkpoint_dir, checkpoints
from clorch.runs.discover import UsageError
from clorch.runs.environment import Difference, differences
from clorch.runs.records import Run
from clorch.runs.rerun import RerunEnd, await_rerun, check_trust, rerun_args, start_rerun


@dataclass
class Verdict:
    """What `verify` found. `identical` is None when the rerun failed before it could tell."""

    run: str
    step: int | None
    exact: bool
    run_sha256: str
    rerun_sha256: str | None = None
    identical: bool | None = None
    differences: list[Difference] = field(default_factory=list)
    failure: str | None = None
    rerun_dir: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = dict(vars(self))
        out["differences"] = [d.to_dict() for d in self.differences]
        return out


def verify(run: Run, steps: int | None, keep: bool, say: Callable[[str], None]) -> Verdict:
    """Rerun `run` (to its end, or to step `steps`) and compare its weights; `say` gets the
    progress line. The rerun's directory is removed afterwards unless `keep`.

    Raises:
        UsageError: nothing to compare with (an unfinished run without --steps, no checkpoint
            of that step), no recorded command, or modules the run trusted and you do not.
    """
    check_trust(run)
    original = _original_sha256(run, steps)
    base = Path(tempfile.mkdtemp(prefix="clorch-verify-"))
    directory = base / "run"
    try:
        args = rerun_args(run, directory, keep_all=steps is not None)
        say(f"rerunning {run.id} ({run.path}) in {directory}{f' to step {steps}' if steps else ''}")
        end = await_rerun(start_rerun(run, directory, args), directory, steps)
        verdict = _judge(run, Run(directory), end, original, steps)
        verdict.rerun_dir = str(directory) if keep else None
        return verdict
    finally:
        if not keep:
            shutil.rmtree(base, ignore_errors=True)


def _original_sha256(run: Run, steps: int | None) -> str:
    """The run's weights digest to compare with: its summary's, or its checkpoint's of step `steps`."""
    if steps is None:
        digest = run.summary.get("weights_sha256")
        if isinstance(digest, str) and digest:
            return digest
        raise UsageError(
            f"RUN {run.id} has no weights_sha256 in summary.json (status {run.status}): only a finished "
            f"run is compared whole; compare it at a checkpoint with --steps K ({_steps_held(run)})"
        )
    if steps < 1:
        raise UsageError(f"--steps must be >= 1 (a checkpoint's step), got {steps}")
    path = step_checkpoint_path(checkpoint_dir(run), steps)
    if not path.is_file():
        sharded = path.with_suffix(".dcp").is_dir()  # step_K.dcp/, parallel=fsdp's
        why = (
            "is sharded (parallel=fsdp), which verify does not read: verify the run whole" if sharded else "is missing"
        )
        raise UsageError(f"--steps {steps}: the run's checkpoint {path} {why} ({_steps_held(run)})")
    try:
        return checkpoint_weights_sha256(path)
    except Exception as exc:  # CheckpointError, OSError: this checkpoint cannot be compared
        raise UsageError(f"--steps {steps}: the run's checkpoint {path} cannot be read ({exc})") from None


def _steps_held(run: Run) -> str:
    steps = [c["step"] for c in checkpoints(run) if c["step"] is not None]
    return f"its checkpoints hold steps {', '.join(map(str, steps))}" if steps else "it has no step checkpoint"


def checkpoint_weights_sha256(path: Path) -> str:
    """`weights_sha256` of the model weights a clorch checkpoint holds (read and verified first)."""
    # lazy: torch (and the checkpoint reader) stay out of clorch-runs' start; only --steps reads one
    from clorch.checkpoint import archive, metadata
    from clorch.strategies import weights_digest

    body = metadata.read(path)
    state = archive.read_archive(metadata.archive_path(path, body), body["archive"], path)["model"]

    class Saved:  # what weights_digest reads of a model: its state_dict(), here the saved one
        def state_dict(self) -> dict[str, Any]:
            return state

    return weights_digest(Saved())


def _judge(run: Run, rerun: Run, end: RerunEnd, original: str, steps: int | None) -> Verdict:
    verdict = Verdict(run.id, steps or run.steps, run.config.get("exact") is True, original)
    if rerun.env:  # a rerun refused before it started records no environment to compare
        verdict.differences = differences(run.env, rerun.env)
    if steps is None:
        digest = rerun.summary.get("weights_sha256") if rerun.status == "succeeded" else None
    else:
        path = step_checkpoint_path(rerun.path / "checkpoints", steps)
        digest = checkpoint_weights_sha256(path) if path.is_file() else None
    if not isinstance(digest, str):
        missed = f"reach its step {steps} checkpoint" if steps else "finish"
        verdict.failure = f"the rerun did not {missed} (exit status {end.returncode}); its last lines:\n{end.tail()}"
        return verdict
    verdict.rerun_sha256, verdict.identical = digest, digest == original
    return verdict


def verdict_text(verdict: Verdict) -> str:
    """What `clorch-runs verify` prints: the verdict, what differs, whether the run was exact."""
    at = f"at step {verdict.step}"
    if verdict.failure:
        lines = [f"not verified: {verdict.failure}"]
    elif verdict.identical:
        lines = [
            f"identical: {at} the rerun's weights are the run's, bit for bit (weights_sha256 {verdict.run_sha256})"
        ]
    else:
        lines = [f"differs: {at} the run's weights_sha256 is {verdict.run_sha256}, the rerun's {verdict.rerun_sha256}"]
    if verdict.differences:
        lines.append("what differs between the run and the rerun:")
        lines += [f"  {d.line()}" for d in verdict.differences]
    elif verdict.identical is False:
        lines.append("nothing recorded differs (torch, CUDA, NCCL, GPU models, clorch, Python, world size, data files)")
    lines.append(_exact_note(verdict))
    if verdict.rerun_dir:
        lines.append(f"the rerun is kept in {verdict.rerun_dir}")
    return "\n".join(lines)


def _exact_note(verdict: Verdict) -> str:
    if not verdict.exact:
        return (
            "the run was not exact=true: it repeats itself on its own world size, but on a GPU, kernels "
            "that are not deterministic need not (exact=true makes them so; docs/reproducibility.md)"
        )
    if verdict.identical is False and not verdict.differences:
        return (
            "the run was exact=true: something not recorded differs (a file your code reads that no "
            "config path key names, uncommitted changes to your code or to clorch, the CPU)"
        )
    return "the run was exact=true"
