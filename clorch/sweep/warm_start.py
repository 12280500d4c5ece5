"""A warm start: another sweep's finished trials added to this sweep's study before its first trial.

    hydra.sweeper.warm_start=multirun/lr-search     on the command line, or `warm_start:` in a space file

The trials COMPLETE in that sweep's study (clorch.sweep.warm_source finds it) are added to
this study with Optuna's public API (`optuna.trial.create_trial` and `study.add_trials`:
their parameters, distributions, values and the values reported at their evals), so the
sampler starts from their results and a pruner compares with them.
They are not run again, not counted in `n_trials`, have no directory here, and are never
this sweep's best trial: its summary and best.yaml are made of its own trial directories.

Each added trial carries the user attribute `clorch_warm_start`, {sweep, uid, number}: the
sweep it first ran in and its number there (kept when the source had it from a warm start of
its own). A trial is added once: continuing the sweep with the same command finds them.

Numbering. Optuna numbers a study's trials in the order they are added, so the k added trials
are the study's trials 0 .. k-1, and this sweep's trial N (its directory SWEEP_DIR/N, its
seed, its place among `enqueue`'s entries) is the study's trial N + k. `Numbering` does that
arithmetic, so that a warm start shifts no directory; it holds only while the added trials
come first, so a warm start is refused to a study that holds trials of its own already.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from clorch.sweep.driver import say
from clorch.sweep.errors import SweepRefused
from clorch.sweep.settings import OptunaSettings
from clorch.sweep.space import SearchSpace
from clorch.sweep.storage import storage_errors
from clorch.sweep.warm_source import WarmSource, own_directory_error, read_source
from clorch.train.trial import open_storage

ATTR = "clorch_warm_start"  # a trial's user attribute: {sweep, uid, number} of the sweep it ran in


@dataclass(frozen=True)
class Numbering:
    """This sweep's trial numbers (its directories' names) and its study's: the study's first
    `added` trials are a warm start's, so this sweep's trial N is the study's trial N + added."""

    added: int = 0

    def study(self, own: int) -> int:
        return own + self.added

    def own(self, study_number: int) -> int:
        return study_number - self.added

    def study_up_to(self, own_last: int) -> int:
        """The last study number a view of "this sweep's trials up to `own_last`" holds: every
        warm-start trial (all ended before the first of this sweep's), then its own up to there."""
        return max(own_last, -1) + self.added


def origin(trial: Any) -> tuple[str, int] | None:
    """(the id of the sweep a warm-start trial first ran in, its number there); None: not one."""
    mark = trial.user_attrs.get(ATTR)
    return None if not isinstance(mark, dict) else (str(mark.get("uid")), int(mark.get("number", -1)))


def numbering(trials: list[Any], where: str) -> Numbering:
    """How `trials` (a study's) number this sweep's trials. Raises SweepRefused where a warm-start
    trial comes after one of the sweep's own (no numbering then keeps every directory's trial)."""
    added = [t.number for t in trials if origin(t) is not None]
    if added != list(range(len(added))):
        raise SweepRefused(
            [
                f"{where} holds warm-start trials ({ATTR}) among its own trials (study numbers {added}): "
                "their directories cannot be told apart; choose another hydra.sweep.dir"
            ]
        )
    return Numbering(len(added))


def add_warm_start(study: Any, settings: OptunaSettings, space: SearchSpace, sweep_dir: Path, uid: str) -> None:
    """Add the finished trials of the sweep `settings.warm_start` names to `study`, once, before
    this sweep's first trial. Raises SweepRefused (each reason a line) before adding any."""
    source = _checked_source(settings, sweep_dir, uid)
    # A trial the source has from this sweep (a warm start of its own from here) is this study's already.
    finished = [t for t in _finished_trials(source) if _origin_of(source, t)[0] != uid]
    differences = _space_differences(finished, space)
    if differences:
        raise SweepRefused(
            [
                f"hydra.sweeper.warm_start={source.sweep_dir} searched another space: {'; '.join(differences)}. "
                "Its trials are added only where they searched the same keys, ranges and choices as this sweep"
            ]
        )
    marked = [origin(t) for t in study.trials if origin(t) is not None]
    new = [t for t in finished if _origin_of(source, t) not in set(marked)]
    kept = len(finished) - len(new)
    own = len(study.trials) - len(marked)
    if own and not kept:
        raise SweepRefused(
            [
                f"hydra.sweeper.warm_start={source.sweep_dir}: this sweep's study holds {own} trial(s) of its own "
                "already, and a warm start is added before a sweep's first trial (its trials would be numbered "
                "among this sweep's); start it in a new hydra.sweep.dir, or drop warm_start to continue"
            ]
        )
    # A continued sweep keeps what it added: a trial added now would be numbered after its own.
    _add(study, source, [] if own else new, kept, left_out=len(new) if own else 0)


def _checked_source(settings: OptunaSettings, sweep_dir: Path, uid: str) -> WarmSource:
    """The sweep `settings.warm_start` names. Raises SweepRefused: it cannot warm start this one."""
    source, errors = read_source(settings.warm_start, settings.objective, settings.direction)
    if source is None:
        raise SweepRefused(errors)
    own = own_directory_error(source, sweep_dir, uid)
    if errors or own:
        raise SweepRefused(errors + ([own] if own else []))
    return source


def _add(study: Any, source: WarmSource, new: list[Any], kept: int, left_out: int) -> None:
    """Add `new` (the source's FrozenTrials) to `study`, and say what the study holds of the warm start."""
    study.add_trials([_copy(source, t) for t in new])
    said = f"warm start from {source.sweep_dir}: {len(new)} finished trial(s) added to the study"
    if kept:
        said += f", {kept} added before and kept"
    if left_out:
        said += f"; {left_out} finished there since this sweep began are left out (it has trials of its own)"
    say(said + "; they are not run again, not counted in n_trials, and never this sweep's best trial")


def _finished_trials(source: WarmSource) -> list[Any]:
    """The COMPLETE trials of the source's study. Raises SweepRefused: it has no such study, or none."""
    key = f"hydra.sweeper.warm_start={source.sweep_dir}"
    url = source.storage_url()
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        raise SweepRefused(
            [f"{key} holds no study ({url.removeprefix('sqlite:///')} is missing); give a sweep that ran"]
        )
    with storage_errors(key):
        storage = open_storage(url)
        if source.study_name() not in optuna.get_all_study_names(storage):
            raise SweepRefused([f"{key}: its storage holds no study {source.study_name()!r}; give a sweep that ran"])
        study = optuna.load_study(study_name=source.study_name(), storage=storage)
        trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if not trials:
        raise SweepRefused([f"{key} holds no finished (COMPLETE) trial to start from; give a sweep that ran"])
    return trials


def _origin_of(source: WarmSource, trial: Any) -> tuple[str, int]:
    return origin(trial) or (source.identity.uid, trial.number)


def _copy(source: WarmSource, trial: Any) -> Any:
    """A new trial of `trial`'s parameters, distributions, values and reported values (its evals'),
    marked with where it first ran; nothing else of it (its sampler's attributes, its sweep's marks)."""
    mark = trial.user_attrs.get(ATTR) or {
        "sweep": str(source.sweep_dir),
        "uid": source.identity.uid,
        "number": trial.number,
    }
    return optuna.trial.create_trial(
        params=trial.params,
        distributions=trial.distributions,
        values=trial.values,
        intermediate_values=trial.intermediate_values,  # a pruner compares at its evals, as with the sweep's own
        user_attrs={ATTR: mark},
    )


def describe(distribution: Any) -> str:
    """An Optuna distribution in the words of Hydra's sweep grammar."""
    if isinstance(distribution, optuna.distributions.CategoricalDistribution):
        return f"choice({', '.join(map(str, distribution.choices))})"
    log = "log " if distribution.log else ""
    if isinstance(distribution, optuna.distributions.IntDistribution):
        if distribution.step != 1:
            return f"int range({distribution.low}, {distribution.high}, step {distribution.step})"
        return f"int {log}interval({distribution.low}, {distribution.high})"
    if distribution.step is not None:
        return f"range({distribution.low}, {distribution.high}, step {distribution.step})"
    return f"{log}interval({distribution.low}, {distribution.high})"


def _space_differences(trials: list[Any], space: SearchSpace) -> list[str]:
    """Each way the trials' searched space differs from `space`, as a phrase (each said once)."""
    here = {p.key: p.distribution() for p in space.params}
    found: list[str] = []
    for trial in trials:
        there = trial.distributions
        for key in [*here, *(k for k in there if k not in here)]:
            if key not in there:
                phrase = f"{key} not searched there, {describe(here[key])} here"
            elif key not in here:
                phrase = f"{key} searched there ({describe(there[key])}), not here"
            elif there[key] != here[key]:
                phrase = f"{key} {describe(there[key])} there, {describe(here[key])} here"
            else:
                continue
            found += [phrase] if phrase not in found else []
    return found
