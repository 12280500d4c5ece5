"""One test per private API of Hydra and Optuna that the sweep leans on (clorch.sweep._private_apis):
an upgrade that changes one fails here, by name."""

from __future__ import annotations

import optuna
import pytest
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser

from clorch.sweep._private_apis import BASIC_SWEEPER, grid_combinations, runs_in_process, trial_id

pytestmark = pytest.mark.timeout(60)


def test_grid_combinations_are_hydras_basic_sweeper_jobs_in_its_order():
    overrides = OverridesParser.create().parse_overrides(["+recipe=cpu_smoke", "seed=1,2", "optim.lr=0.1,0.2"])
    assert grid_combinations(overrides) == [
        ["+recipe=cpu_smoke", "seed=1", "optim.lr=0.1"],
        ["+recipe=cpu_smoke", "seed=1", "optim.lr=0.2"],
        ["+recipe=cpu_smoke", "seed=2", "optim.lr=0.1"],
        ["+recipe=cpu_smoke", "seed=2", "optim.lr=0.2"],
    ]


def test_basic_sweeper_is_the_target_hydras_own_config_names():
    import hydra.core.plugins  # noqa: F401  (registers Hydra's configs)
    from hydra._internal.core_plugins import basic_sweeper  # noqa: F401

    node = ConfigStore.instance().load("hydra/sweeper/basic.yaml").node
    assert node._target_ == BASIC_SWEEPER


def test_runs_in_process_knows_hydras_basic_launcher_and_no_other():
    from hydra._internal.core_plugins.basic_launcher import BasicLauncher

    assert runs_in_process(BasicLauncher()) is True
    assert runs_in_process(object()) is False


def test_trial_id_is_the_storage_id_that_addresses_the_trial(tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    study = optuna.create_study(study_name="s", storage=storage)
    first, second = study.ask(), study.ask()
    for trial in (first, second):
        assert storage.get_trial(trial_id(trial)).number == trial.number
    frozen = study.trials[1]
    assert trial_id(frozen) == trial_id(second)
    storage.set_trial_user_attr(trial_id(frozen), "k", 1)  # what the heartbeats write through
    assert optuna.load_study(study_name="s", storage=storage).trials[1].user_attrs == {"k": 1}
