"""A sweep's trial, seen from its ranks: report the objective at each eval, stop when pruned.

The Optuna sweeper (clorch.sweep.study) starts each trial with the
environment variable CLORCH_TRIAL: a JSON object naming the study (`storage`,
`study`), the trial (`trial_id`), the metric to report (`objective`) and the
pruner (`pruner`, `min_trials`, `pruner_args`). It is inherited by the trial's ranks. At every
eval (`eval_every`), rank 0 reports the metric to the study and asks the pruner;
the answer is broadcast, so every rank stops at that same eval. What rank 0 learns
from the study, an answer or an error (the storage cannot be reached), is broadcast
the same way, so every rank raises together and none waits in a collective for a
rank that has failed (as optuna-integration's TorchDistributedTrial does). A run
started without CLORCH_TRIAL (every run outside a sweep) reports nothing and is
never pruned.

With `hydra.sweeper.pruner=asha` rank 0 also decides, at each rung's eval, whether the trial
goes on or is paused (clorch.train.asha); a paused trial raises `Paused` on every rank, and the
worker writes a checkpoint at that step before the trial ends with status paused.

In a repeatable sweep (`hydra.sweeper.repeatable`) the link also names `compared_up_to`:
the pruner then sees the study through `trials_up_to`, holding only the trials numbered
that or below, which had all ended before this trial started. Its decision at each
step is then the same whichever other trials end, or report, while this one trains.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from functools import cache
from typing import Any, Mapping

from clorch.train import asha

ENV = "CLORCH_TRIAL"


class Paused(Exception):
    """ASHA paused this trial at a rung (raised on every rank at once): checkpoint, then end."""

    def __init__(self, step: int) -> None:
        super().__init__(f"paused at step {step}")
        self.step = step


class Pruned(Exception):
    """The sweep's pruner stopped this trial at an eval (raised on every rank at once)."""

    def __init__(self, step: int) -> None:
        super().__init__(f"pruned at step {step}")
        self.step = step


@dataclass(frozen=True)
class TrialLink:
    """Where a trial reports: the study's storage and name, the trial's id, the metric, the pruner."""

    storage: str
    study: str
    trial_id: int
    # a metric name as summary.json's `final` has it: loss, eval_loss, eval_accuracy...; empty: none to
    # report (a sweep of several objectives, whose study Optuna's trials cannot report to at an eval)
    objective: str
    pruner: str = "none"
    min_trials: int = 5
    compared_up_to: int | None = None  # the pruner sees the trials numbered this or below; None: every trial
    pruner_args: dict[str, Any] | None = None  # the pruner's arguments by Optuna's keyword (n_warmup_steps, ...)

    def to_env(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "TrialLink | None":
        """The link the sweeper gave this process, or None (not a sweep's Optuna trial)."""
        text = (os.environ if environ is None else environ).get(ENV)
        if not text:
            return None
        try:
            return cls(**json.loads(text))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{ENV} is not a trial link clorch's sweeper wrote: {exc}") from None


def make_pruner(name: str, min_trials: int, args: Mapping[str, Any] | None = None) -> Any:
    """Optuna's pruner of that name: none, median (MedianPruner) or hyperband (HyperbandPruner),
    with `args` by Optuna's keywords (checked before the sweep: clorch.sweep.algorithms). A step
    is a training step: a trial reports its objective at each eval. asha is clorch's own
    (clorch.train.asha), which pauses rather than prunes: Optuna's pruner then prunes nothing."""
    import optuna  # lazy: only a sweep's processes need Optuna

    if name == "median":
        return optuna.pruners.MedianPruner(**{"n_startup_trials": min_trials, "n_warmup_steps": 0, **(args or {})})
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(**(args or {}))
    return optuna.pruners.NopPruner()


def open_storage(url: str) -> Any:
    """Optuna's storage (an RDBStorage) at `url`; SQLite waits for a lock for up to 60 s, since the trials of
    a sweep report to one file at once."""
    import optuna  # lazy: only a sweep's processes need Optuna

    if url.startswith("sqlite:"):
        return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})
    return optuna.storages.RDBStorage(url)


def trials_up_to(storage: Any, last: int) -> Any:
    """A view of the Optuna storage `storage` in which a study holds only its trials numbered `last` or below.

    Optuna's samplers and pruners read a study's trials through its storage's `get_all_trials`
    (tests/sweep/test_repeatable_source.py holds them to it); that alone is filtered. Everything
    else reaches `storage` itself: a trial read by its id (the trial being asked or pruned), and
    every write (a new trial, its parameters, a reported value, a sampler's or pruner's attributes),
    so the study in `storage` records all that happens through the view.
    """
    return _view_class()(storage, last)


@cache
def _view_class() -> type:
    import optuna  # lazy: only a sweep's processes need Optuna

    base = optuna.storages.BaseStorage

    def delegate(name: str) -> Any:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return getattr(self.storage, name)(*args, **kwargs)

        method.__name__ = name
        return method

    def __init__(self: Any, storage: Any, last: int) -> None:
        self.storage, self.last = storage, last

    def get_all_trials(self: Any, study_id: int, deepcopy: bool = True, states: Any = None) -> list[Any]:
        trials = self.storage.get_all_trials(study_id, deepcopy=deepcopy, states=states)
        return [t for t in trials if t.number <= self.last]

    # Every method a storage must have goes to `storage`, but the listing of a study's trials.
    namespace = {name: delegate(name) for name in base.__abstractmethods__}
    namespace.update(__init__=__init__, get_all_trials=get_all_trials, __doc__=trials_up_to.__doc__)
    return type("TrialsUpTo", (base,), namespace)


def eval_metric(objective: str, metrics: Mapping[str, float]) -> float | None:
    """The objective among an eval's metrics (`evaluate` names them without the `eval_` prefix);
    None for an objective that is not an eval metric (the final train loss: nothing to report)."""
    if not objective.startswith("eval_"):
        return None
    value = metrics.get(objective.removeprefix("eval_"))
    return None if value is None else float(value)


class StudyUnreachable(RuntimeError):
    """Rank 0 could not reach the sweep's study; raised on every other rank at the same eval
    (rank 0 raises its own error there)."""


CONTINUE, PRUNE, FAILED, PAUSE = 0, 1, 2, 3  # what rank 0 broadcasts at each eval


class TrialReporter:
    """Rank 0 reports each eval to the study and asks the pruner; every rank learns the answer.

    `should_stop` is collective when the job has more than one rank: every rank must
    call it at the same eval (one broadcast from rank 0, `broadcast_flag`, of CONTINUE,
    PRUNE, PAUSE or FAILED; it blocks until rank 0 has heard from the study). When rank 0 could
    not reach the study (here, or when it loaded it before training), it broadcasts
    FAILED and raises what Optuna's storage raised, while every other rank raises
    StudyUnreachable: all at the same eval, so the trial fails rather than run
    unreported and no rank waits in a collective for one that has failed.
    """

    def __init__(
        self, link: TrialLink, rank: int, broadcast_flag: Any, total_steps: int = 0, eval_every: int = 0
    ) -> None:
        self.link, self.rank, self._broadcast = link, rank, broadcast_flag
        self.total_steps, self.eval_every = total_steps, eval_every  # the trial's: its ASHA rungs
        self._trial = None
        self._error: Exception | None = None  # rank 0's, raised at the next eval with the others
        if rank == 0:  # before training starts: Optuna's import and the study's load are not training time
            try:
                self._optuna_trial()
            except Exception as exc:  # the storage: said at the first eval, on every rank together
                self._error = exc

    def _optuna_trial(self) -> Any:
        if self._trial is None:
            import optuna  # lazy: only a sweep's processes need Optuna

            storage, last = open_storage(self.link.storage), self.link.compared_up_to
            study = optuna.load_study(
                study_name=self.link.study,
                storage=storage if last is None else trials_up_to(storage, last),
                pruner=make_pruner(self.link.pruner, self.link.min_trials, self.link.pruner_args),
            )
            self._trial = optuna.trial.Trial(study, self.link.trial_id)
        return self._trial

    def _decide(self, step: int, metrics: Mapping[str, float]) -> int:
        """Rank 0's answer: CONTINUE, PRUNE, PAUSE (ASHA), or FAILED (its error kept to raise)."""
        if self._error is not None:
            return FAILED
        try:
            value = eval_metric(self.link.objective, metrics)
            if value is None:
                return CONTINUE
            trial = self._optuna_trial()
            trial.report(value, step)
            if self.link.pruner == "asha":
                return self._asha(trial, step)
            return PRUNE if self.link.pruner != "none" and trial.should_prune() else CONTINUE
        except Exception as exc:  # the storage: broadcast first, so that no rank waits for this one
            self._error = exc
            return FAILED

    def _asha(self, trial: Any, step: int) -> int:
        """At a rung: go on (recorded, so that a resumed trial goes on there too) or PAUSE
        (recorded before the checkpoint is written: a trial killed in between is still paused
        there, and a promotion replays it to the rung bit for bit)."""
        args = self.link.pruner_args or {}
        factor = args.get("reduction_factor") or asha.DEFAULT_REDUCTION_FACTOR
        if step not in asha.ladder(args.get("min_resource"), factor, self.total_steps, self.eval_every):
            return CONTINUE
        import optuna  # lazy: only a sweep's processes need Optuna

        trials = trial.study.get_trials(deepcopy=False)
        maximize = trial.study.direction == optuna.study.StudyDirection.MAXIMIZE
        mark = asha.Mark.of(trial.user_attrs)
        if asha.goes_on(trials, trial.number, step, factor, maximize):
            trial.set_user_attr(asha.ATTR, mark.go_on(step))
            return CONTINUE
        trial.set_user_attr(asha.ATTR, mark.pause(step))
        return PAUSE

    def should_stop(self, step: int, metrics: Mapping[str, float]) -> bool:
        """Whether the pruner stopped the trial at this eval (collective: see the class).

        Raises:
            Paused: ASHA paused the trial here (on every rank).
        """
        answer = self._broadcast(self._decide(step, metrics) if self.rank == 0 else CONTINUE)
        if answer == FAILED or (self._error is not None and self.rank == 0):
            if self._error is not None:
                raise self._error
            raise StudyUnreachable(
                f"rank 0 could not report step {step} to the sweep's study {self.link.study!r} "
                f"({self.link.storage}); its error is in rank 0's output"
            )
        if answer == PAUSE:
            raise Paused(step)
        return answer == PRUNE
