"""The Optuna sweeper's source of trials: a study in the sweep directory, asked one trial at a time.

The study lives in SWEEP_DIR/optuna.db (SQLite) unless `hydra.sweeper.storage`
names another storage, under the sweep directory's name unless
`hydra.sweeper.study_name` gives one. Running the sweep's command again with the
same `hydra.sweep.dir` loads the same study: its finished and pruned trials are
kept, a trial that was cut off runs again in its own directory (from its latest
checkpoint when it writes checkpoints), and new trials are asked until the study
holds `n_trials`.

The same seed gives the same trials: each trial's sampler is seeded with the
sampler's seed plus the trial's number (the QMC sampler, whose sequence is the
seed's, with the seed), so a sweep that was stopped and continued asks, with
n_jobs=1, what the uninterrupted sweep would have asked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna

from clorch.engine.results import RunSummary
from clorch.status import Status
from clorch.sweep.driver import RESUME, UNFINISHED, TrialSpec, say, writes_checkpoints
from clorch.sweep.settings import STUDY_FILE, OptunaSettings
from clorch.sweep.space import SearchSpace
from clorch.train.trial import ENV, TrialLink, make_pruner, open_storage

DEFAULT_OBJECTIVE = "eval_loss"  # else the final train loss, for a trial whose summary lacks it


def objective_of(summary: RunSummary, objective: str | None) -> float | None:
    """The trial's objective from its summary's final metrics (None: it has none)."""
    final = summary.final or {}
    if objective is not None:
        value = final.get(objective)
    else:
        value = final.get(DEFAULT_OBJECTIVE, final.get("loss"))
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def make_sampler(settings: OptunaSettings, space: SearchSpace, number: int) -> Any:
    """The sampler that asks trial `number`, seeded as the module's docstring says."""
    name, seed = settings.sampler.name, settings.sampler.seed
    trial_seed = None if seed is None else seed + number
    if name == "random":
        return optuna.samplers.RandomSampler(seed=trial_seed)
    if name == "grid":
        grid = {p.key: _grid_values(p) for p in space.params}
        return optuna.samplers.GridSampler(grid, seed=trial_seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=trial_seed)
    if name == "qmc":
        return optuna.samplers.QMCSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=trial_seed, constant_liar=settings.n_jobs > 1)


def _grid_values(param: Any) -> list[Any]:
    """Every value of a choice or a range, as Optuna stores them."""
    if param.kind == "choice":
        return list(param.distribution().choices)
    count = int(round((param.high - param.low) / param.step)) + 1
    values = [param.low + i * param.step for i in range(count)]
    return [int(v) for v in values] if param.kind == "int" else values


class StudySource:
    """Trials from an Optuna study (clorch.sweep.driver.Source)."""

    def __init__(self, settings: OptunaSettings, space: SearchSpace, sweep_dir: Path, overrides: list[str]) -> None:
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # clorch says what happens to each trial
        self.settings, self.space, self.sweep_dir = settings, space, sweep_dir
        self.storage_url = settings.storage or f"sqlite:///{(sweep_dir / STUDY_FILE).resolve()}"
        self.name = settings.study_name or sweep_dir.name
        self.study = optuna.create_study(
            study_name=self.name,
            storage=open_storage(self.storage_url),
            direction=settings.direction,
            pruner=make_pruner(settings.pruner, settings.min_trials),
            load_if_exists=True,
        )
        self._fixed_sampler = None if settings.sampler.seed is not None else make_sampler(settings, space, 0)
        self.cut_off = [t for t in self.study.trials if t.state == optuna.trial.TrialState.RUNNING]
        self._announce()

    def _announce(self) -> None:
        trials = self.study.trials
        if not trials:
            return
        kept = [t for t in trials if t.state.is_finished()]
        say(
            f"continuing the sweep in {self.sweep_dir}: study {self.name!r} holds {len(kept)} finished trial(s), "
            f"kept; {len(self.cut_off)} cut off, run again; up to {self.settings.n_trials} in all"
        )

    def _spec(self, trial_id: int, number: int, params: dict[str, Any], resume: bool) -> TrialSpec:
        values = {p.key: p.decode(params[p.key]) for p in self.space.params}
        link = TrialLink(
            storage=self.storage_url,
            study=self.name,
            trial_id=trial_id,
            objective=self.settings.objective or DEFAULT_OBJECTIVE,
            pruner=self.settings.pruner,
            min_trials=self.settings.min_trials,
        )
        overrides = self.space.trial_overrides(values) + ([RESUME] if resume else [])
        label = " ".join(p.override(values[p.key]) for p in self.space.params)
        return TrialSpec(number, overrides, {ENV: link.to_env()}, label)

    def next(self) -> TrialSpec | None:
        if self.cut_off:
            trial = self.cut_off.pop(0)
            resume = writes_checkpoints(self.sweep_dir / str(trial.number))
            return self._spec(trial._trial_id, trial.number, trial.params, resume)
        if len(self.study.trials) >= self.settings.n_trials:
            return None
        number = len(self.study.trials)
        self.study.sampler = self._fixed_sampler or make_sampler(self.settings, self.space, number)
        trial = self.study.ask({p.key: p.distribution() for p in self.space.params})
        return self._spec(trial._trial_id, trial.number, trial.params, resume=False)

    def ended(self, spec: TrialSpec, summary: RunSummary) -> None:
        state = optuna.trial.TrialState
        if summary.status in UNFINISHED:
            return  # cut off: the study keeps it running, and continuing the sweep runs it again
        if summary.status is Status.PRUNED:
            self.study.tell(spec.number, state=state.PRUNED)
            return
        value = objective_of(summary, self.settings.objective) if summary.status is Status.SUCCEEDED else None
        if value is None:
            self.study.tell(spec.number, state=state.FAIL)
        else:
            self.study.tell(spec.number, value)
