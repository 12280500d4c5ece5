"""The Optuna sweeper's source of trials: a study, asked one trial at a time.

Where the study lives, and how it is checked to be this sweep's: clorch.sweep.storage.
Running the sweep's command again with the same `hydra.sweep.dir` loads the same
study: its finished and pruned trials are kept, a trial that was cut off
(clorch.sweep.heartbeat) runs again in its own directory (from its latest
checkpoint when it writes checkpoints), and new trials are asked until the study
holds `n_trials` (or the grid sampler has tried its whole grid).

A warm start (`hydra.sweeper.warm_start`, clorch.sweep.warm_start) puts another sweep's
finished trials first in the study: this sweep's trial N, in SWEEP_DIR/N, is then the
study's trial N + their count. Numbers below are the sweep's unless they say the study's.

The same seed gives the same trials: each trial's sampler is seeded with the
sampler's seed plus the trial's number in the study (the QMC sampler, whose sequence is the
seed's, with the seed), so a sweep that was stopped and continued asks what the
uninterrupted sweep would have asked.

With trials side by side (n_jobs=N), which trial ends first is chance. A repeatable
sweep (`hydra.sweeper.repeatable`, true when the sampler is seeded) takes it out of
the results by a fixed rule: trial k starts once every trial numbered k - N or below
has ended (it waits for them if need be); a sampler that learns from results (TPE,
CMA-ES) asks it on a view of the study that holds only those trials (trials_up_to),
and its pruner compares it with those same trials (clorch.train.trial). The random,
grid and QMC samplers choose by the trial's number, whatever has ended, and ask on
the study itself. Without a pruner or a learning sampler no trial waits.

A trial that succeeded is told to the study with its objective, a finite number from
its summary's final metrics; without one (a misspelt `objective`, a NaN loss) the study
records it failed and the console says why. A trial's directory that already holds a
finished trial is never given to a new one.

With a time budget (`hydra.sweeper.timeout`, seconds from this sweep's start, as Optuna's
`optimize(timeout=)`) no trial starts once it is spent, a cut-off one included; the running
trials finish, and the sweep ends as it would at `n_trials`.
"""

from __future__ import annotations

import math
import time
import warnings
from pathlib import Path
from typing import Any

import optuna

from clorch.engine.results import RunSummary
from clorch.status import Status
from clorch.sweep._private_apis import trial_id
from clorch.sweep.errors import SweepRefused
from clorch.engine.interrupts import raise_if_signalled
from clorch.sweep.enqueue import optuna_params
from clorch.sweep.driver import RESUME, UNFINISHED, TrialSpec, say, writes_checkpoints
from clorch.sweep.heartbeat import Heartbeats, cut_off
from clorch.sweep.settings import OptunaSettings
from clorch.sweep.space import SearchSpace
from clorch.sweep.storage import open_study, storage_errors, where
from clorch.sweep.warm_start import add_warm_start, numbering
from clorch.train import asha
from clorch.train.trial import ENV, TrialLink, make_pruner, trials_up_to

DEFAULT_OBJECTIVE = "eval_loss"  # else the final train loss, for a trial whose summary lacks it
LEARNING = ("tpe", "cmaes")  # the samplers whose choice depends on the trials that have ended
POLL_S = 1.0  # how often a repeatable sweep looks whether another sweep's trial has ended


def read_objective(summary: RunSummary, objective: str | None) -> tuple[float | None, str | None]:
    """(the trial's objective from its summary's final metrics, None and why when it has none)."""
    final = summary.final or {}
    name = objective or (DEFAULT_OBJECTIVE if DEFAULT_OBJECTIVE in final else "loss")
    value = final.get(name)
    if value is None:
        wanted = (
            f"hydra.sweeper.objective={objective}" if objective else f"the objective ({DEFAULT_OBJECTIVE}, else loss)"
        )
        return None, f"{wanted} is not in its final metrics (it has: {', '.join(sorted(final)) or 'none'})"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None, f"its {name} is {value!r}, not a number"
    if not math.isfinite(value):
        return None, f"its {name} is {value}, which no trial can be ranked by"
    return float(value), None


def objective_of(summary: RunSummary, objective: str | None) -> float | None:
    """The trial's objective from its summary's final metrics (None: it has none, or not a finite one)."""
    return read_objective(summary, objective)[0]


def make_sampler(settings: OptunaSettings, space: SearchSpace, number: int) -> Any:
    """The sampler that asks trial `number`, seeded as the module's docstring says."""
    name, seed = settings.sampler.name, settings.sampler.seed
    trial_seed = None if seed is None else seed + number
    if name == "random":
        return optuna.samplers.RandomSampler(seed=trial_seed)
    if name == "grid":  # the seed orders the grid: every trial's sampler must see one order
        grid = {p.key: _grid_values(p) for p in space.params}
        return optuna.samplers.GridSampler(grid, seed=seed)
    args = settings.sampler.arguments()  # by Optuna's keywords, checked before the sweep (clorch.sweep.algorithms)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=trial_seed, **args)
    if name == "qmc":
        return optuna.samplers.QMCSampler(seed=seed)
    # Constant liar: running trials count as bad ones, so that trials side by side differ; a
    # repeatable sweep asks where no trial is running (trials_up_to).
    args.setdefault("constant_liar", settings.n_jobs > 1 and not settings.repeats())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # multivariate, group, constant_liar
        return optuna.samplers.TPESampler(seed=trial_seed, **args)


def _grid_values(param: Any) -> list[Any]:
    """Every value of a choice or a range, as Optuna stores them."""
    if param.kind == "choice":
        return list(param.distribution().choices)
    count = int(round((param.high - param.low) / param.step)) + 1
    values = [param.low + i * param.step for i in range(count)]
    return [int(v) for v in values] if param.kind == "int" else values


class StudySource:
    """Trials from an Optuna study (clorch.sweep.driver.Source); `close` when the sweep ends.

    Raises (from any method): StorageError, the storage failed; SweepRefused, the study
    is not this sweep's or would send a new trial into a finished trial's directory.
    """

    def __init__(self, settings: OptunaSettings, space: SearchSpace, sweep_dir: Path, uid: str) -> None:
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # clorch says what happens to each trial
        self.settings, self.space, self.sweep_dir = settings, space, sweep_dir
        self.where = where(settings, sweep_dir)
        self.study, self.storage, self.storage_url, self.name = open_study(settings, sweep_dir, uid)
        with storage_errors(self.where):
            if settings.warm_start:
                add_warm_start(self.study, settings, space, sweep_dir, uid)
            # This sweep's trial N (SWEEP_DIR/N) is the study's N + the warm start's trials (clorch.sweep.warm_start).
            self.numbering = numbering(self.study.trials, self.where)
        self._fixed: Any = None  # without a seed: one study object, one sampler for every trial
        self.repeats = settings.repeats()
        self.several = len(settings.objectives()) > 1  # a multi-objective study (clorch.sweep.objectives)
        # A repeatable sweep's trial waits for trials k - n_jobs and below only where they decide something.
        self.waits = self.repeats and (settings.sampler.name in LEARNING or settings.pruning().name != "none")
        # Trial numbers below are this sweep's (its directories' names); `numbering` gives the study's.
        self.running: set[int] = set()  # the numbers of the trials this sweep runs now
        self.lost: set[int] = set()  # trials cut off while this sweep runs: continuing the sweep runs them
        self._said: set[int] = set()  # the trials this sweep said it waits for
        # hydra.sweeper.timeout: no trial starts past this time.monotonic(); None: no budget
        self.deadline = None if settings.timeout is None else time.monotonic() + settings.timeout
        self.out_of_time = False  # the budget has ended the sweep (said once)
        self.asha = settings.pruning().name == "asha"  # trials pause at rungs and are promoted (clorch.train.asha)
        with storage_errors(self.where):
            self.heartbeats = Heartbeats(self.storage, uid)
            found = cut_off(self.study.trials, uid, own_file=not settings.storage)
            self.cut_off = [t for t in found if not asha.is_paused(t)]  # a paused trial waits for its promotion
        self._announce()

    def _announce(self) -> None:
        trials = self.study.trials[self.numbering.added :]  # the warm start's were said when added
        if not trials:
            return
        kept = [t for t in trials if t.state.is_finished()]
        paused = sum(map(asha.is_paused, trials))
        elsewhere = sum(t.state == optuna.trial.TrialState.RUNNING for t in trials) - len(self.cut_off) - paused
        live = f"; {elsewhere} running in another sweep, left to it" if elsewhere else ""
        waiting = f"; {paused} paused by ASHA, kept for promotion" if paused else ""
        say(
            f"continuing the sweep in {self.sweep_dir}: study {self.name!r} holds {len(kept)} finished trial(s), "
            f"kept{waiting}; {len(self.cut_off)} cut off, run again{live}; up to {self.settings.n_trials} in all"
        )

    def _spec(self, trial_id_: int, number: int, params: dict[str, Any], resume: bool) -> TrialSpec:
        values = {p.key: p.decode(params[p.key]) for p in self.space.params}
        # ASHA compares a trial with every result of its rung (its sweep runs one trial at a time
        # where it repeats: clorch.sweep.settings)
        compared = self._seen_by(number) if self.repeats and not self.asha else None
        link = TrialLink(
            storage=self.storage_url,
            study=self.name,
            trial_id=trial_id_,
            # Several objectives: nothing to report at an eval (Optuna's trials report one value, to prune)
            objective="" if self.several else (self.settings.objective or DEFAULT_OBJECTIVE),
            pruner=self.settings.pruning().name,
            min_trials=self.settings.min_trials,
            pruner_args=self.settings.pruning().arguments(),
            compared_up_to=compared,
        )
        overrides = self.space.trial_overrides(values) + ([RESUME] if resume else [])
        label = " ".join(p.override(values[p.key]) for p in self.space.params)
        return TrialSpec(number, overrides, {ENV: link.to_env()}, label)

    def _asking(self, number: int) -> Any:
        """The study object that asks trial `number`, with that trial's sampler."""
        if self.settings.sampler.seed is None and self._fixed is not None:
            return self._fixed
        learns = self.repeats and self.settings.sampler.name in LEARNING
        study = optuna.load_study(
            study_name=self.name,
            storage=trials_up_to(self.storage, self._seen_by(number)) if learns else self.storage,
            # Seeded by the study's number: after a warm start from a sweep of the same seed, its startup
            # trials are not asked again (clorch.sweep.warm_start).
            sampler=make_sampler(self.settings, self.space, self._study_number(number)),
            pruner=make_pruner(
                self.settings.pruning().name, self.settings.min_trials, self.settings.pruning().arguments()
            ),
        )
        if self.settings.sampler.seed is None:
            self._fixed = study
        return study

    def next(self) -> TrialSpec | None:
        if self._past_deadline():
            return None
        with storage_errors(self.where):
            if self.cut_off:
                if not self._ready(self._own(self.cut_off[0])):
                    return None
                trial = self.cut_off.pop(0)
                self.heartbeats.mark(trial_id(trial))
                # An ASHA trial may hold its pause's checkpoint, whatever its policy (none: a fresh start)
                resume = self.asha or writes_checkpoints(self.sweep_dir / str(self._own(trial)))
                return self._started(self._spec(trial_id(trial), self._own(trial), trial.params, resume))
            promoted = self._promoted()
            if promoted is not None:
                return promoted
            number = self.numbering.own(len(self.study.trials))  # a warm start's trials count for nothing
            if number >= self.settings.n_trials:
                return self._ended_sweep()
            if not self._ready(number):
                return None
            asking = self._asking(number)
            if isinstance(asking.sampler, optuna.samplers.GridSampler) and asking.sampler.is_exhausted(asking):
                return self._ended_sweep()  # every point of the grid tried, as Optuna's optimize would
            trial = self._ask(asking, number)
            self._refuse_finished_dir(trial)
            self.heartbeats.mark(trial_id(trial))
            return self._started(self._spec(trial_id(trial), self._own(trial), trial.params, resume=False))

    def _own(self, trial: Any) -> int:
        """The number of the study's `trial` in this sweep: its directory's name."""
        return self.numbering.own(trial.number)

    def _study_number(self, number: int) -> int:
        return self.numbering.study(number)

    def _seen_by(self, number: int) -> int:
        """The last study number that trial `number` of a repeatable sweep is asked and pruned on:
        the trials numbered `number - n_jobs` and below, and every warm-start trial."""
        return self.numbering.study_up_to(number - self.settings.n_jobs)

    def _maximizes(self) -> bool:
        return self.study.direction == optuna.study.StudyDirection.MAXIMIZE

    def _promoted(self) -> TrialSpec | None:
        """A paused trial that ASHA's rule promotes now (clorch.train.asha), to continue from its
        checkpoint in its own directory; None: none (or not an ASHA sweep)."""
        if not self.asha:
            return None
        factor = self.settings.pruning().reduction_factor or asha.DEFAULT_REDUCTION_FACTOR
        trials = self.study.get_trials(deepcopy=False)
        found, why = asha.promotion(trials, factor, self._maximizes()), f"among the best 1/{factor} there"
        if found is None and self._nothing_else(trials):
            found = asha.closing_promotion(trials, self._maximizes())
            why = "the best paused trial of the highest rung: nothing else is left to run, and no trial has finished"
        if found is None:
            return None
        trial, step = found
        # Recorded before it starts: a sweep stopped now finds it cut off, and runs it again from there.
        self.storage.set_trial_user_attr(trial_id(trial), asha.ATTR, asha.Mark.of(trial.user_attrs).go_on(step))
        self.heartbeats.mark(trial_id(trial))
        say(f"trial {self._own(trial)} promoted from step {step} ({why}): it continues from its checkpoint")
        return self._started(self._spec(trial_id(trial), self._own(trial), trial.params, resume=True))

    def _nothing_else(self, trials: list[Any]) -> bool:
        """This sweep has asked its n_trials and runs none, and none is cut off: it would end now."""
        return self.numbering.own(len(trials)) >= self.settings.n_trials and not (
            self.running or self.lost or self.cut_off
        )

    def _ended_sweep(self) -> None:
        """None (no trial to start now); once nothing runs and no trial is left to run, ASHA's paused
        trials are told to the study as pruned (Optuna's word for a trial stopped at a rung; their
        summary.json keeps `paused`, and the attribute clorch_asha their step)."""
        if not self.asha or self.running or self.lost:
            return None
        for trial in self.study.get_trials(deepcopy=False):
            if asha.is_paused(trial):
                self.study.tell(trial.number, state=optuna.trial.TrialState.PRUNED)
        return None

    def _past_deadline(self) -> bool:
        """Whether the time budget (hydra.sweeper.timeout) is spent; the console hears it once."""
        if self.deadline is None or time.monotonic() < self.deadline:
            return False
        if not self.out_of_time:
            self.out_of_time = True
            say(
                f"the time budget (hydra.sweeper.timeout={self.settings.timeout:g} s) ended the sweep: no new trial "
                f"starts; {len(self.running)} running trial(s) finish"
            )
        return True

    def _ask(self, asking: Any, number: int) -> Any:
        """Trial `number`: the enqueued trial of that index (clorch.sweep.enqueue), else `asking`'s choice."""
        distributions = {p.key: p.distribution() for p in self.space.params}
        enqueued = self.settings.enqueue or []
        if number >= len(enqueued):
            return asking.ask(distributions)
        # Enqueued and asked at once on the study's own storage (a repeatable sweep's view lists only
        # older trials, so its ask would not find the waiting one); the keys the entry leaves out
        # are sampled by this trial's sampler.
        study = optuna.load_study(
            study_name=self.name,
            storage=self.storage,
            sampler=make_sampler(self.settings, self.space, self._study_number(number)),
        )
        study.enqueue_trial(optuna_params(self.space, enqueued[number]))
        return study.ask(distributions)

    def _started(self, spec: TrialSpec) -> TrialSpec:
        self.running.add(spec.number)
        return spec

    def _ready(self, number: int) -> bool:
        """Whether trial `number` may start now: in a repeatable sweep that waits, once every trial
        numbered `number - n_jobs` or below has ended. False: one of this sweep's own has not (the
        driver asks again when one ends), or one was cut off (continuing the sweep runs it). A
        trial of another sweep sharing the storage is waited for here."""
        if not self.waits:
            return True
        last = number - self.settings.n_jobs
        while True:
            running = self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
            pending = [self._own(t) for t in running if self._own(t) <= last and not asha.is_paused(t)]
            if not pending:
                return True
            if self.running.intersection(pending):
                return False
            self._say_waiting(number, pending)
            if self.lost.intersection(pending):
                return False
            raise_if_signalled()
            time.sleep(POLL_S)

    def _say_waiting(self, number: int, pending: list[int]) -> None:
        if number in self._said:
            return
        self._said.add(number)
        lost = sorted(self.lost.intersection(pending))
        if lost:
            say(
                f"trial {number} waits for trial {lost[0]}, which was cut off; run the sweep's command again "
                "to run it and continue"
            )
        else:
            say(f"trial {number} waits for trial {pending[0]}, running in another sweep of study {self.name!r}")

    def _refuse_finished_dir(self, trial: Any) -> None:
        run_dir = self.sweep_dir / str(self._own(trial))
        if (run_dir / "summary.json").exists():
            self.study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            raise SweepRefused(
                [
                    f"{self.where} asked for trial {self._own(trial)}, but {run_dir} holds a finished trial the study "
                    "does not know (was the study replaced?): restore the study, or choose another hydra.sweep.dir"
                ]
            )

    def ended(self, spec: TrialSpec, summary: RunSummary) -> None:
        state = optuna.trial.TrialState
        tid = TrialLink.from_env(spec.env).trial_id
        self.running.discard(spec.number)
        with storage_errors(self.where):
            if summary.status in UNFINISHED:
                self.heartbeats.release(tid)  # cut off: continuing the sweep runs it again
                self.lost.add(spec.number)
                return
            self.heartbeats.ended(tid)
            if summary.status is Status.PAUSED:
                return  # RUNNING in the study, paused there by its rank 0 (clorch.train.asha): promotion's
            if summary.status is Status.PRUNED:
                self.study.tell(self._study_number(spec.number), state=state.PRUNED)
                return
            read = [read_objective(summary, name) for name in self.settings.objectives()]
            why = next((why for value, why in read if value is None), None)
            if summary.status is Status.SUCCEEDED and why is not None:
                say(f"trial {spec.number}: {why}; the study records it failed")
            if why is not None or summary.status is not Status.SUCCEEDED:
                self.study.tell(self._study_number(spec.number), state=state.FAIL)
            else:
                values = [value for value, _ in read]
                self.study.tell(self._study_number(spec.number), values if self.several else values[0])

    def close(self) -> None:
        self.heartbeats.close()
