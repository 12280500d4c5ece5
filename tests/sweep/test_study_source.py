"""The Optuna sweeper's source of trials (clorch.sweep.study.StudySource), without running trials:
the grid sampler's end, a NaN trial, a trial directory that holds a finished trial; and a rank's
report to an unreachable study raised on every rank together (clorch.train.trial)."""

from __future__ import annotations

import optuna
import pytest
import torch
import torch.distributed as dist

from clorch.engine.results import RunSummary
from clorch.status import Status
from clorch.sweep.errors import SweepRefused
from clorch.sweep.settings import OptunaSettings, SamplerSettings
from clorch.sweep.space import parse_space
from clorch.sweep.study import StudySource
from clorch.train.trial import StudyUnreachable, TrialLink, TrialReporter
from tests.harness import run_ranks

pytestmark = pytest.mark.timeout(120)


def _source(sweep_dir, sampler: str = "grid", n_trials: int = 5) -> StudySource:
    space, errors = parse_space(["seed=choice(1,2)", "epochs=2"])
    assert not errors
    settings = OptunaSettings(n_trials=n_trials, sampler=SamplerSettings(name=sampler, seed=0))
    return StudySource(settings, space, sweep_dir, uid="u")


def _succeeded(value: float) -> RunSummary:
    return RunSummary(status=Status.SUCCEEDED, final={"loss": 1.0, "eval_loss": value})


def test_the_grid_sampler_ends_the_sweep_once_its_grid_is_used_up(tmp_path):
    source = _source(tmp_path)
    specs = []
    while (spec := source.next()) is not None:  # Optuna's GridSampler would call study.stop() here
        specs.append(spec)
        source.ended(spec, _succeeded(0.5 + spec.number))
    source.close()
    assert sorted(s.label for s in specs) == ["seed=1", "seed=2"]
    assert [t.state.name for t in source.study.trials] == ["COMPLETE", "COMPLETE"]


def test_a_nan_trial_is_recorded_failed_with_the_reason(tmp_path, capsys):
    source = _source(tmp_path, sampler="random", n_trials=2)
    first, second = source.next(), source.next()
    source.ended(first, _succeeded(float("nan")))
    source.ended(second, _succeeded(0.25))
    source.close()
    assert [t.state.name for t in source.study.trials] == ["FAIL", "COMPLETE"]
    assert source.study.best_trial.number == 1
    assert "trial 0: its eval_loss is nan, which no trial can be ranked by; the study records it failed" in (
        capsys.readouterr().out
    )


def test_a_new_trial_never_trains_into_a_finished_trials_directory(tmp_path):
    source = _source(tmp_path, sampler="random")
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "summary.json").write_text('{"status": "succeeded"}')
    with pytest.raises(SweepRefused, match=f"{tmp_path / '0'} holds a finished trial the study does not know"):
        source.next()
    source.close()


def _int_broadcast(code):
    """As the training loop's hooks broadcast rank 0's answer (clorch.train.worker)."""
    value = torch.tensor([int(code)])
    dist.broadcast(value, src=0)
    return int(value.item())


def _report_to_a_lost_study(rank: int, world_size: int, storage: str) -> str:
    link = TrialLink(storage=storage, study="gone", trial_id=0, objective="eval_loss", pruner="median")
    reporter = TrialReporter(link, rank, _int_broadcast)
    try:
        reporter.should_stop(10, {"loss": 0.5})
    except StudyUnreachable as exc:
        return f"StudyUnreachable: {exc}"
    except Exception as exc:
        return type(exc).__name__
    return "went on"


def test_a_storage_error_on_rank_0_is_raised_on_every_rank_together(tmp_path):
    storage = f"sqlite:///{tmp_path / 'none.db'}"
    optuna.create_study(study_name="other", storage=storage)  # a storage without the trial's study
    ends = run_ranks(_report_to_a_lost_study, 2, storage, timeout=60)
    assert ends[0] == "KeyError", ends  # Optuna's own error on rank 0
    assert ends[1].startswith("StudyUnreachable: rank 0 could not report step 10 to the sweep's study 'gone'"), ends
