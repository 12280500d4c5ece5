"""Several trials on one GPU (hydra.sweeper.trials_per_gpu): the slots, the checks, and `auto`'s count."""

from __future__ import annotations

import pytest

from clorch.plan.plan import plan_overrides
from clorch.sweep.gpu_share import largest_need, trials_per_gpu
from clorch.sweep.settings import OptunaSettings, optuna_errors
from clorch.sweep.slots import plan_slots, ranks_per_trial

GPT = ["+recipe=cpu_smoke", "model=gpt", "data=arithmetic", "model.n_layer=2", "model.d_model=64", "model.n_head=4"]


def test_trials_share_a_gpu_up_to_trials_per_gpu_each_with_its_own_cores():
    slots = plan_slots(4, 1, ["0"], list(range(8)), per_gpu=4)
    assert [s.gpus for s in slots] == [("0",)] * 4
    assert [s.cores for s in slots] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    # spread over the GPUs, and a trial's ranks always on distinct GPUs
    assert [s.gpus for s in plan_slots(4, 1, ["0", "1"], list(range(4)), per_gpu=2)] == [("0",), ("1",)] * 2
    assert [s.gpus for s in plan_slots(3, 2, ["0", "1", "2"], [0, 1, 2], per_gpu=2)] == [
        ("0", "1"), ("2", "0"), ("1", "2"),
    ]  # fmt: skip
    assert ranks_per_trial("auto", 4, ["0", "1"], [0, 1], per_gpu=2) == 1


def test_more_trials_than_the_gpus_hold_are_refused_naming_both_keys():
    with pytest.raises(ValueError, match=r"n_jobs=5 .* need 5 GPUs at once with hydra.sweeper.trials_per_gpu=2"):
        plan_slots(5, 1, ["0", "1"], [0, 1], per_gpu=2)


@pytest.mark.parametrize("value", [0, -1, "two", 1.5, True])
def test_trials_per_gpu_is_an_integer_or_auto(value):
    errors = optuna_errors(OptunaSettings(trials_per_gpu=value))
    assert f"hydra.sweeper.trials_per_gpu must be an integer >= 1 or auto, got {value!r}" in errors
    assert not optuna_errors(OptunaSettings(trials_per_gpu="auto"))


def test_auto_takes_the_largest_trials_estimate_and_changes_nothing_without_gpus():
    assert trials_per_gpu(3, [GPT], ["0"]) == (3, None)
    assert trials_per_gpu("auto", [GPT], []) == (1, None)  # on CPU each trial has its own cores
    small, large = largest_need([GPT]), largest_need([GPT, [*GPT, "batch_size=512"]])
    assert small is not None and large > small  # activations grow with the batch


def test_auto_is_refused_where_the_trials_memory_is_not_estimated():
    # a model of your own: its activations are not estimated
    own = ["+recipe=cpu_smoke", "model=custom", "+model._target_=torch.nn.Linear", "+model.in_features=8",
           "+model.out_features=4"]  # fmt: skip
    assert plan_overrides(own).config.model.name == "custom"  # it plans: only its memory is unknown
    assert largest_need([own]) is None
    with pytest.raises(ValueError, match="set hydra.sweeper.trials_per_gpu=K"):
        trials_per_gpu("auto", [own], ["0"])
