"""The per-rank entry point: `clorch.train.worker:main(ctx)`, started by the launcher.

`ctx["args"]` names the launch plan's file (`clorch.plan.plan_file.write_plan`: the
checked config, world size, planned steps, and their digest) and the run directory;
the ranks trust the plan once its digest matches. Each rank builds its components, resumes if asked,
trains (`clorch.train.loop.fit`) with logging, evaluation and checkpoints
after each step as configured, and returns a JSON summary (rank 0's is the
run's). Rank 0 writes metrics.jsonl and prints a plain line per log step.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping

import torch

from clorch.checkpoint.weights import save_safetensors
from clorch.plan.plan import Plan
from clorch.plan.plan_file import read_plan
from clorch.config.layout import ParallelLayout
from clorch.config.schema import TrainConfig
from clorch.distributed import all_reduce, broadcast, is_initialized
from clorch.train import checkpoints, preflight
from clorch.train.components import Components, build_components
from clorch.train.evaluate import evaluate
from clorch.train.loop import LoopState, StepResult, fit
from clorch.train.metrics import MetricsWriter, announce, read_metrics, resumed_history
from clorch.train.trial import Paused, Pruned, TrialLink, TrialReporter


def _mean_norm(state: LoopState) -> float | None:
    """The mean gradient norm of the window's steps (its finite ones; the same on every rank),
    or None: every one overflowed (fp16)."""
    if state.window_norm is None:
        return None
    count = state.window_norms.item()
    return state.window_norm.item() / count if count else None


EXPORT_FILE = "model.safetensors"  # checkpoint.export=safetensors, in the run directory


class StepHooks:
    """What happens after each optimizer step: log, evaluate, checkpoint. `layout` is the plan's
    (the data-parallel ranks whose losses and samples the log counts, and evaluation splits over);
    None (a loop of components built without a plan, as clorch-bench's) arranges parts' ranks as
    `cfg.parallel` does."""

    def __init__(
        self,
        cfg: TrainConfig,
        parts: Components,
        run_dir: Path,
        total: int,
        writer: MetricsWriter | None,
        layout: ParallelLayout | None = None,
    ):
        self.cfg, self.parts, self.run_dir, self.total, self.writer = cfg, parts, run_dir, total, writer
        self.layout = cfg.parallel.layout(parts.world_size) if layout is None else layout
        self.tokens = getattr(parts.task, "tokens_per_sample", None)
        self.last_eval: dict[str, float] = {}
        link = TrialLink.from_env()  # a sweep's Optuna trial reports each eval (clorch.train.trial)
        self.reporter = None if link is None else TrialReporter(link, parts.rank, self._agreed, total, cfg.eval_every)

    def _agreed(self, flag: int) -> int:
        """Rank 0's `flag` (a small int: clorch.train.trial's CONTINUE, PRUNE, PAUSE, FAILED) on every
        rank (collective: one broadcast when there are several ranks)."""
        if not (is_initialized() and self.parts.world_size > 1):
            return flag
        value = torch.tensor([int(flag)], device=self.parts.device)
        broadcast(value, src=0)
        return int(value.item())

    def __call__(self, state: LoopState, result: StepResult) -> None:
        cfg, step = self.cfg, state.step
        if step % cfg.log_every == 0 or step == self.total:
            self.log(state)
        if cfg.eval_every and step % cfg.eval_every == 0 and step != self.total:
            metrics = self.eval(state)
            if self.reporter is not None and self.reporter.should_stop(step, metrics):
                raise Pruned(step)  # on every rank at once: the answer was broadcast
        ckpt = cfg.checkpoint
        # The last step too, so that resume=latest after a finished run finds the end.
        if ckpt.policy == "periodic" and (step % ckpt.every_n_steps == 0 or step == self.total):
            directory = checkpoints.checkpoint_dir(cfg, self.run_dir)
            checkpoints.save(cfg, self.parts, checkpoints.step_path(cfg, directory, step), state, self.run_dir)
            if self.parts.rank == 0:
                checkpoints.prune(cfg, self.run_dir)

    def log(self, state: LoopState) -> None:
        """Average the window's loss over ranks and write one metrics line (rank 0).

        Every rank must call it: one all_reduce (a host sync, only on logging steps), none where
        the strategy's loss is the job's already (exact=true).
        """
        parts = self.parts
        window = state.window_loss.detach().clone().float()
        # every data-parallel rank's own loss, or (exact=true) the job's loss on every rank already
        ranks = 1 if parts.strategy.loss_is_global else self.layout.dp_size
        if is_initialized() and ranks > 1:
            all_reduce(window, op="sum")
        loss = window.item() / (ranks * state.window_steps)
        elapsed = max(time.perf_counter() - state.window_start, 1e-9)
        samples_per_s = state.window_samples * self.layout.dp_size / elapsed
        record = {
            "kind": "train",
            "step": state.step,
            "epoch": state.epoch,
            "loss": loss,
            "grad_norm": _mean_norm(state),
            "lr": state.lr if state.lr is not None else parts.optimizer.param_groups[0]["lr"],
            "loss_scale": parts.precision.scale,
            "skipped_steps": parts.precision.skipped_steps,
            "samples_per_s": samples_per_s,
        }
        if self.tokens:
            record["tokens_per_s"] = samples_per_s * self.tokens
        state.window_loss, state.window_steps, state.window_samples = None, 0, 0
        state.window_norm = state.window_norms = None
        state.window_start = time.perf_counter()
        if self.writer is not None:
            self.writer.write(record)
            norm = "" if record["grad_norm"] is None else f" grad_norm {record['grad_norm']:.4g}"
            print(
                f"step {state.step}/{self.total} epoch {state.epoch} loss {loss:.6g}{norm} "
                f"lr {record['lr']:.3g} {samples_per_s:,.0f} samples/s",
                flush=True,
            )

    def eval(self, state: LoopState) -> dict[str, float]:
        """Evaluate on the held-out split (collective: every rank calls it) and log it."""
        start = time.perf_counter()
        metrics = evaluate(self.parts, self.layout)
        self.last_eval = metrics
        record = {
            "kind": "eval",
            "step": state.step,
            "epoch": state.epoch,
            **{f"eval_{k}": v for k, v in metrics.items()},
            "time_s": time.perf_counter() - start,
        }
        if self.writer is not None:
            self.writer.write(record)
            shown = " ".join(f"eval_{k} {v:.6g}" for k, v in metrics.items())
            print(f"step {state.step}/{self.total} {shown}", flush=True)
        # the window's throughput should not count the evaluation
        state.window_start += time.perf_counter() - start
        return metrics


def _start(plan: Plan, parts: Components, run_dir: Path) -> tuple[LoopState, str | None, list[dict[str, Any]] | None]:
    """The loop state to start from, the checkpoint resumed (or None) and, on rank 0 of a
    resumed run, the metrics records its metrics.jsonl starts with."""
    cfg, total = plan.config, plan.total_steps
    path = checkpoints.agreed_resume_path(cfg, run_dir)
    if path is None:
        return LoopState(), None, None
    state = checkpoints.restore(parts, path, seed=cfg.seed, layout=plan.layout)
    history = None
    if parts.rank == 0:
        resharded = f"; {state.resume_note}" if state.resume_note else ""
        print(f"resumed from {path} at step {state.step} (epoch {state.epoch}){resharded}", flush=True)
        history, note, fields = _history(run_dir, state, total)
        if state.resume_note:  # the console showed it before launch (the plan's description)
            fields["resharded"] = state.resume_note
        message = f"resuming from {path} at step {state.step} (epoch {state.epoch})"
        if state.step >= total:
            message = (
                f"{path} is already at step {state.step}, the run's last ({total}): "
                "nothing is left to train; evaluating and saving only"
            )
        # Announced before metrics.jsonl is written: the console then knows which of its
        # records are carried over (and shows this line instead of them).
        announce(run_dir, message + note, **fields)
        if state.resume_warning:  # a `clorch: warning: ...` line on the console, and in events.jsonl
            print(state.resume_warning, flush=True)
            announce(run_dir, state.resume_warning, batch_statistics=True)
    return state, str(path), history


def _history(run_dir: Path, state: LoopState, total: int) -> tuple[list[dict[str, Any]], str, dict[str, Any]]:
    """The records a run resumed at `state.step` starts its metrics.jsonl with, what to add to
    the resume's announcement, and the event's fields.

    Resumed from another run's checkpoint: that run's records up to the step, copied,
    so that this directory holds the whole history too and the earlier one's files
    stay as that run left them. A restart (or resume) in this directory keeps its
    own records up to the step. The records after the step are trained again.
    """
    source = Path(state.resumed_run_dir) if state.resumed_run_dir else run_dir
    if source.resolve() == run_dir.resolve():
        own = read_metrics(run_dir / "metrics.jsonl", skip_damaged=True)
        return resumed_history(own, state.step, total), "", {}
    fields: dict[str, Any] = {"resumed_run_dir": str(source)}
    metrics = source / "metrics.jsonl"
    if not metrics.is_file():
        return [], f"; {metrics} is gone, so this run's metrics start after step {state.step}", fields
    history = resumed_history(read_metrics(metrics, skip_damaged=True), state.step, total)
    fields["carried_records"] = len(history)
    return history, f"; the metrics up to step {state.step} are carried over from {metrics}", fields


def main(ctx: Mapping[str, Any]) -> dict[str, Any] | None:
    """Train one rank from `ctx["args"]` = {"plan_file": str, "run_dir": str}.

    Every rank of the job must run it (the launcher does); see `fit` for the
    synchronization points. Returns rank 0's summary (None on other ranks).

    Raises:
        ValueError: the plan file is not one clorch wrote, or was changed after (`read_plan`).
    """
    return train(read_plan(Path(ctx["args"]["plan_file"])), Path(ctx["args"]["run_dir"]), ctx)


def plan_of(ctx: Mapping[str, Any]) -> Plan:
    """The plan in a rank's launch arguments, for a worker of your own (`execute(worker=...)`):
    the file clorch's launcher names ("plan_file"), or the plan itself ("plan": `Plan.to_dict()`,
    as a rank of `launcher=torchrun` receives it, adapted to the world size its rendezvous formed).

    Raises:
        ValueError: the plan file is not one clorch wrote, or was changed after (`read_plan`).
    """
    args = ctx["args"]
    return read_plan(Path(args["plan_file"])) if "plan_file" in args else Plan.from_dict(args["plan"])


def _continued_run_dir(state: LoopState, resumed_from: str | None, run_dir: Path) -> str | None:
    """The run directory whose history this one continues (None: a fresh start, or this directory)."""
    earlier = state.resumed_run_dir if resumed_from else None
    if earlier is not None and Path(earlier).resolve() == run_dir.resolve():
        return None
    return earlier


def _preflight(plan: Plan, run_dir: Path, rank: int) -> Any:
    """The preflight's verdict, or None (`preflight.run_first`: every rank calls it), checking the
    checkpoint directory's free space where the run writes checkpoints."""
    cfg = plan.config
    directory = checkpoints.checkpoint_dir(cfg, run_dir) if cfg.checkpoint.policy != "none" else None
    return preflight.run_first(plan, run_dir, directory, rank)


def _writer(cfg: TrainConfig, run_dir: Path, history: list[dict[str, Any]] | None) -> MetricsWriter:
    """Rank 0's metrics.jsonl (starting with a resumed run's `history`), and TensorBoard's files when asked."""
    tb = run_dir / "tensorboard" if cfg.logger.tensorboard else None
    return MetricsWriter(run_dir / "metrics.jsonl", history=history, tensorboard_dir=tb)


def _pause(cfg: TrainConfig, parts: Components, state: LoopState, run_dir: Path) -> None:
    """ASHA paused the trial: a step checkpoint here, whatever `checkpoint.policy` says, which the
    promoted trial resumes from (checkpoint.resume=latest). Every rank calls it (collective)."""
    directory = checkpoints.checkpoint_dir(cfg, run_dir)
    checkpoints.save(cfg, parts, checkpoints.step_path(cfg, directory, state.step), state, run_dir)
    if parts.rank == 0 and cfg.checkpoint.policy == "periodic":
        checkpoints.prune(cfg, run_dir)


def _end_of_training(
    cfg: TrainConfig, parts: Components, hooks: StepHooks, state: LoopState, run_dir: Path, stopped_at: int | None
) -> tuple[dict[str, float], str | None, str | None]:
    """The final evaluation, checkpoint and export (none after a pruned or paused run: its last
    eval instead) and the weights digest. Every rank calls it: each of them may be collective."""
    final_eval = hooks.eval(state) if stopped_at is None else hooks.last_eval
    if stopped_at is None and cfg.checkpoint.policy in ("final", "periodic"):
        checkpoints.save(cfg, parts, checkpoints.final_path(cfg, run_dir), state, run_dir)
    exported = _export(cfg, parts, run_dir) if stopped_at is None else None
    # Every rank calls it: a sharded model's weights are gathered one parameter at a time.
    return final_eval, exported, parts.strategy.weights_digest()


def train(
    plan: Plan, run_dir: Path, ctx: Mapping[str, Any], hooks_class: type[StepHooks] = StepHooks
) -> dict[str, Any] | None:
    """`main`'s body, for one rank: build, resume, fit, evaluate, checkpoint, summarize.

    Args:
        plan: the launch plan.
        run_dir: the run directory.
        ctx: the launcher's context (rank, world_size, ...).
        hooks_class: what runs after each optimizer step (a subclass adds to it).
    """
    cfg, total = plan.config, plan.total_steps
    rank = int(ctx.get("rank", 0))
    checked = _preflight(plan, run_dir, rank)
    if preflight.stops_here(plan, checked):  # failed, or preflight=only: nothing is built
        return {"steps": 0, "preflight": preflight.summary_of(checked)} if rank == 0 else None
    parts = build_components(cfg, ctx, total, plan.layout)
    state, resumed_from, history = _start(plan, parts, run_dir)
    writer = _writer(cfg, run_dir, history) if parts.rank == 0 else None
    hooks = hooks_class(cfg, parts, run_dir, total, writer, plan.layout)
    start, first_step, pruned_at, paused_at = time.perf_counter(), state.step, None, None
    try:
        try:
            fit(parts, total, state, hooks)
        except Pruned as stop:  # the sweep's pruner: no final eval, checkpoint or export
            pruned_at = stop.step
        except Paused as stop:  # ASHA: a checkpoint to continue from, if the sweep promotes the trial
            paused_at = stop.step
            _pause(cfg, parts, state, run_dir)
        train_time = time.perf_counter() - start
        stopped_at = pruned_at if paused_at is None else paused_at
        final_eval, exported, digest = _end_of_training(cfg, parts, hooks, state, run_dir, stopped_at)
    finally:
        if writer is not None:
            writer.close()
    if parts.rank != 0:
        return None
    return {
        "steps": state.step,
        "epoch": state.epoch,
        "resumed_from": resumed_from,
        "resumed_run_dir": _continued_run_dir(state, resumed_from, run_dir),
        "train_time_s": train_time,
        **_throughput(parts, plan.layout, hooks.tokens, state.step - first_step, train_time),
        "final_eval": final_eval,
        "weights_sha256": digest,
        "preflight": preflight.summary_of(checked) if checked is not None else None,
        "exported": exported,
        "pruned_at": pruned_at,
        "paused_at": paused_at,
    }


def _throughput(
    parts: Components, layout: ParallelLayout, tokens: int | None, steps: int, seconds: float
) -> dict[str, float | None]:
    """Samples and tokens (`tokens` a sample; None: not a token model) per second over the whole
    job, from the planned global batch of `steps` steps (an epoch's shorter last step aside)."""
    samples = steps * parts.batch_size * parts.accumulation * layout.dp_size
    return {
        "samples_per_s": samples / max(seconds, 1e-9),
        "tokens_per_s": samples * tokens / max(seconds, 1e-9) if tokens else None,
    }


def _export(cfg: TrainConfig, parts: Components, run_dir: Path) -> str | None:
    """Rank 0 writes the final weights for other tools (checkpoint.export); the path, or None.

    Every rank must call it: the strategy may gather a sharded model's parameters to rank 0's
    host memory one at a time (torch's full state dict with CPU offload; the other ranks keep none).
    """
    if cfg.checkpoint.export != "safetensors":
        return None
    weights = parts.strategy.export_weights()
    if parts.rank != 0:
        return None
    return str(save_safetensors(weights, run_dir / EXPORT_FILE))
