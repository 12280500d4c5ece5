"""A sweep's search space and keys, read from Hydra's grammar (no process starts here)."""

from __future__ import annotations

import pytest

from clorch.sweep.checks import as_hydra_overrides, chosen_sweeper, read_sweep
from clorch.sweep.settings import OptunaSettings, read_space_file
from clorch.sweep.slots import plan_slots, ranks_per_trial
from clorch.sweep.space import parse_space

pytestmark = pytest.mark.timeout(60)


def _space(*overrides: str):
    space, errors = parse_space(list(overrides))
    assert errors == []
    return space


def test_hydras_grammar_becomes_optunas_distributions():
    space = _space(
        "optim.lr=tag(log, interval(1e-4, 1e-1))",
        "batch_size=range(16, 65, 16)",
        "optim=choice(adamw, sgd)",
        "seed=1,2,3",
        "max_steps=7",
    )
    params = {p.key: p for p in space.params}
    lr = params["optim.lr"].distribution()
    assert (lr.low, lr.high, lr.log) == (1e-4, 1e-1, True)
    batch = params["batch_size"].distribution()  # Hydra's range excludes its end; Optuna's includes it
    assert (batch.low, batch.high, batch.step) == (16, 64, 16)
    assert params["optim"].distribution().choices == ("adamw", "sgd")
    assert params["seed"].distribution().choices == (1, 2, 3)
    assert space.fixed == ["max_steps=7"]
    assert space.trial_overrides({"optim.lr": 0.01, "batch_size": 32, "optim": "sgd", "seed": 2}) == [
        "max_steps=7",
        "optim.lr=0.01",
        "batch_size=32",
        "optim=sgd",
        "seed=2",
    ]


def test_the_checks_run_on_every_choice_and_both_bounds():
    space = _space("optim.lr=interval(0.1, 0.5)", "optim=choice(adamw, sgd)")
    assert space.representative_overrides() == [
        ["optim.lr=0.1", "optim=adamw"],
        ["optim.lr=0.5", "optim=adamw"],
        ["optim.lr=0.1", "optim=sgd"],
    ]


@pytest.mark.parametrize(
    "override, expected",
    [
        ("optim.lr=interval(1e-1, 1e-4)", "optim.lr: interval(0.1, 0.0001) must have its lower bound first"),
        ("optim.lr=tag(log, interval(0, 1))", "needs a lower bound > 0 (a log scale)"),
        ("seed=range(5, 1)", "holds no value"),
        ("seed=choice(1, 1)", "names a value twice"),
        ("optim.lr=interval(1e-4", "optim.lr=interval(1e-4: "),
    ],
)
def test_a_wrong_space_is_an_error_naming_the_key_and_the_rule(override, expected):
    space, errors = parse_space([override])
    assert space is None and len(errors) == 1 and expected in errors[0], errors


def test_the_sweepers_keys_are_read_from_the_command_line_over_a_space_file(tmp_path):
    space_file = tmp_path / "space.yaml"
    space_file.write_text("params:\n  optim.lr: tag(log, interval(1e-4, 1e-1))\n  seed: [1, 2]\nn_trials: 9\n")
    sweep, errors = read_sweep(
        [
            "hydra/sweeper=optuna",
            f"hydra.sweeper.space={space_file}",
            "hydra.sweeper.n_trials=4",
            "hydra/sweeper/sampler=random",
            "hydra.sweeper.sampler.seed=3",
            "max_steps=2",
        ]
    )
    assert errors == []
    assert sweep.settings.n_trials == 4 and sweep.settings.sampler.name == "random"
    assert sweep.settings.sampler.seed == 3
    assert [p.key for p in sweep.space.params] == ["optim.lr", "seed"] and sweep.space.fixed == ["max_steps=2"]
    assert chosen_sweeper([]) == "basic" and chosen_sweeper(["hydra/sweeper=clorch_optuna"]) == "optuna"
    assert as_hydra_overrides(["hydra/sweeper=optuna", "hydra/sweeper/sampler=qmc", "a=1"]) == [
        "hydra/sweeper=clorch_optuna",
        "hydra.sweeper.sampler.name=qmc",
        "a=1",
    ]


def test_a_space_file_is_data_it_may_not_say_where_results_go_or_name_code(tmp_path):
    space_file = tmp_path / "space.yaml"
    space_file.write_text(
        "storage: sqlite:////tmp/elsewhere.db\n_target_: os.system\nparams:\n  model._target_: os.system\n"
        "  hydra.run.dir: x\n"
    )
    _, errors = read_space_file(space_file)
    assert any("storage is not allowed in a search-space file" in e for e in errors), errors
    assert any("_target_ is not allowed in a search-space file" in e for e in errors), errors
    assert any("params.model._target_ is not allowed" in e for e in errors), errors
    assert any("params.hydra.run.dir is not allowed" in e for e in errors), errors


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["hydra/sweeper/sampler=annealing"], "hydra.sweeper.sampler=annealing is not allowed; choose one of: tpe"),
        (
            ["hydra.sweeper.pruner=percentile"],
            "hydra.sweeper.pruner=percentile is not allowed; choose one of: none, median",
        ),
        (["hydra.sweeper.n_trials=0"], "hydra.sweeper.n_trials must be an integer >= 1, got 0"),
        (["hydra.sweeper.direction=up"], "hydra.sweeper.direction=up is not allowed; choose one of: minimize"),
        (["hydra.sweeper.ntrials=3"], "hydra.sweeper.ntrials is not a key of this sweeper"),
        (["hydra/sweeper/sampler=grid", "optim.lr=interval(0.1, 0.2)"], "an interval has no grid"),
    ],
)
def test_a_wrong_sweeper_key_is_an_error_naming_the_key_the_value_and_what_is_allowed(overrides, expected):
    _, errors = read_sweep(["hydra/sweeper=optuna", "seed=choice(1, 2)", *overrides])
    assert any(expected in e for e in errors), errors


def test_the_grid_sweeper_refuses_optunas_keys():
    _, errors = read_sweep(["seed=1,2", "hydra.sweeper.n_trials=3"])
    assert errors and "belongs to hydra/sweeper=optuna" in errors[0]
    assert read_sweep(["seed=1,2", "hydra.sweeper.n_jobs=2"])[0].settings.n_jobs == 2


def test_slots_share_gpus_and_cores_without_overlap_or_refuse_naming_both_counts():
    slots = plan_slots(4, 2, [str(g) for g in range(8)], list(range(16)))
    assert [s.gpus for s in slots] == [("0", "1"), ("2", "3"), ("4", "5"), ("6", "7")]
    assert [s.cores for s in slots][1] == (4, 5, 6, 7)
    assert slots[1].environ() == {"OMP_NUM_THREADS": "2", "CUDA_VISIBLE_DEVICES": "2,3"}
    cpu = plan_slots(2, 1, [], [0, 1])
    assert [s.cores for s in cpu] == [(0,), (1,)] and cpu[0].environ() == {"OMP_NUM_THREADS": "1"}
    with pytest.raises(ValueError, match=r"n_jobs=3 trials of 1 CPU rank\(s\) need 3 cores at once.*has 2"):
        plan_slots(3, 1, [], [0, 1])
    with pytest.raises(ValueError, match=r"need 8 GPUs at once; this machine has 2"):
        plan_slots(4, 2, ["0", "1"], [0, 1])
    assert ranks_per_trial("auto", 4, [str(g) for g in range(8)], []) == 2
    assert ranks_per_trial("auto", 2, [], [0, 1]) == 1 and ranks_per_trial(3, 2, [], [0]) == 3


def test_the_yaml_files_hold_the_settings_defaults():
    from importlib import resources

    import yaml

    from clorch.sweep.settings import GridSettings, SamplerSettings

    folder = resources.files("clorch.conf") / "hydra" / "sweeper"
    optuna = yaml.safe_load((folder / "clorch_optuna.yaml").read_text())
    grid = yaml.safe_load((folder / "clorch_grid.yaml").read_text())
    defaults = OptunaSettings()
    assert optuna.pop("sampler") == vars(SamplerSettings())
    assert {k: v for k, v in optuna.items() if k != "_target_"} == {
        k: v for k, v in vars(defaults).items() if k != "sampler"
    }
    assert {k: v for k, v in grid.items() if k != "_target_"} == vars(GridSettings())
