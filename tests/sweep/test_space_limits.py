"""What a sweep reads before its first trial stays bounded, and a sweep form the sweeper would
ignore or cannot run is refused: tags, intervals on the grid, huge ranges and choices, spaces."""

from __future__ import annotations

import tracemalloc

import pytest

from clorch.sweep.checks import read_sweep, sweep_errors
from clorch.sweep.space import MAX_GRID, MAX_LINES, MAX_PARAMS, MAX_VALUES, parse_space

pytestmark = pytest.mark.timeout(60)


def _one_error(*overrides: str) -> str:
    space, errors = parse_space(list(overrides))
    assert space is None and len(errors) == 1, errors
    return errors[0]


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "optim.lr=tag(logg, interval(1e-4, 1e-1))",
            "optim.lr=tag(logg, interval(1e-4, 1e-1)): tag logg is not known; an interval takes the tag: log",
        ),
        ("optim.lr=tag(log, uniform, interval(1e-4, 1e-1))", "tag uniform is not known"),
        ("batch_size=tag(log, range(1, 9))", "tag log applies to an interval only, and a choice or range takes no"),
        ("optim=tag(log, choice(adamw, sgd))", "write tag(log, interval(LOW, HIGH)), or tag(log, int(interval("),
        ("seed=range(0, 4, 0)", "seed: range(0, 4, 0) needs finite numbers and a step other than 0"),
    ],
)
def test_a_tag_or_range_the_search_would_not_follow_is_refused(override, expected):
    assert expected in _one_error(override)


def test_an_int_cast_and_the_log_tag_are_what_an_interval_takes():
    space, errors = parse_space(["warmup=tag(log, int(interval(1, 1000)))", "optim.lr=tag(log, interval(1e-4, 1e-1))"])
    assert errors == []
    warmup, lr = space.params
    assert (warmup.kind, warmup.log, lr.kind, lr.log) == ("int", True, "float", True)


def test_a_huge_range_is_counted_not_listed():
    tracemalloc.start()
    try:
        space, errors = parse_space(["seed=range(0, 1000000)"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert errors == [] and peak < 1 << 20, f"{peak:,} bytes to read one range"
    space, errors = parse_space(["batch_size=range(1, 100000000000)", "x=range(0.5, 2.0, 0.25)", "y=range(9, 0, -3)"])
    assert errors == []
    batch, x, y = space.params
    assert (batch.kind, batch.low, batch.high, batch.step, batch.size()) == ("int", 1, 99999999999, 1, 99999999999)
    assert (x.kind, x.low, x.high, x.step, x.size()) == ("float", 0.5, 1.75, 0.25, 6)
    assert (y.kind, y.choices) == ("choice", (9, 6, 3))  # descending: listed, as Hydra lists it


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "seed=shuffle(range(0, 20000))",
            "seed: shuffle(range(0, 20000, 1)) holds 20,000 values, and a shuffled or descending "
            f"range is searched as a choice of at most {MAX_VALUES:,}: write it ascending",
        ),
        ("seed=range(20000, 0, -1)", "seed: range(20000, 0, -1) holds 20,000 values"),
        (
            f"seed=choice({','.join(map(str, range(MAX_VALUES + 1)))})",
            f"seed: a choice of {MAX_VALUES + 1:,} values; a choice holds at most {MAX_VALUES:,}",
        ),
    ],
)
def test_a_choice_too_large_to_search_is_refused_before_it_is_listed(override, expected):
    assert _one_error(override).startswith(expected)


def test_a_space_of_too_many_keys_is_refused():
    searched = [f"k{i}=choice(1, 2)" for i in range(MAX_PARAMS + 1)]
    assert f"the search space has {MAX_PARAMS + 1} searched keys (k0, k1, k2, ...)" in _one_error(*searched)
    fixed = [f"k{i}=1" for i in range(MAX_LINES + 1)]
    assert f"the sweep has {MAX_LINES + 1} overrides and search-space keys; at most {MAX_LINES}" in _one_error(*fixed)


class _Checks:
    """sweep_errors' callbacks, counting the trial configs it would check."""

    def __init__(self) -> None:
        self.checked: list[list[str]] = []

    def check(self, overrides: list[str]) -> list[str]:
        self.checked.append(overrides)
        return []

    @staticmethod
    def compose(overrides: list[str]) -> dict:
        return {"eval_every": 0, "launcher": {"name": "local", "nproc_per_node": 1}}


def test_a_large_choice_is_checked_at_a_bounded_set_of_its_values():
    checks = _Checks()  # 10,000 values: its first, its last, its largest number and a string
    choice = f"seed=choice({', '.join(map(str, range(9_998)))}, fast, [1,2])"
    assert sweep_errors(["hydra/sweeper=optuna", choice], checks.check, checks.compose) == []
    assert checks.checked == [["seed=0"], ["seed=[1,2]"], ["seed=9997"], ["seed=fast"]]


def test_small_choices_are_checked_at_every_value_until_the_checks_would_be_many():
    checks = _Checks()
    small = ["hydra/sweeper=optuna", "a=choice(1, 2, 3)", "b=choice(x, y)"]
    sweep_errors(small, checks.check, checks.compose)
    assert checks.checked == [["a=1", "b=x"], ["a=2", "b=x"], ["a=3", "b=x"], ["a=1", "b=y"]]
    checks = _Checks()
    many = ["hydra/sweeper=optuna", *(f"k{i}=choice({', '.join(map(str, range(16)))})" for i in range(8))]
    sweep_errors(many, checks.check, checks.compose)  # 1 + 8 * 15 lists: each key at its ends instead
    assert len(checks.checked) == 1 + 8 and ["k0=15", *(f"k{i}=0" for i in range(1, 8))] in checks.checked


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["optim.lr=interval(1e-4,1e-1)"],
            "optim.lr=interval(1e-4,1e-1): the grid (hydra/sweeper=basic) runs listed values, and an interval "
            "lists none: search optim.lr with hydra/sweeper=optuna, or list values with choice(...) or range(...)",
        ),
        (
            ["seed=range(0, 200)", "batch_size=range(1, 101)"],
            f"the grid (hydra/sweeper=basic) holds 20,000 trials (200 x 100); it runs at most {MAX_GRID:,}",
        ),
        (
            ["hydra/sweeper=optuna", "hydra/sweeper/sampler=grid", "seed=range(0, 20000)"],
            f"hydra/sweeper/sampler=grid lists 20,000 combinations; it lists at most {MAX_GRID:,}",
        ),
    ],
)
def test_a_grid_that_cannot_be_listed_is_refused_naming_the_key_or_its_size(overrides, expected):
    _, errors = read_sweep(overrides)
    assert len(errors) == 1 and errors[0].startswith(expected), errors


def test_a_grid_within_its_limit_is_read():
    sweep, errors = read_sweep(["seed=range(0, 100)", "batch_size=range(1, 101)"])
    assert errors == [] and sweep.sweeper == "basic"


def test_the_grids_params_are_swept_and_checked_as_hydras_basic_sweeper_would():
    overrides = ['hydra.sweeper.params.seed="1,abc"', "max_steps=2"]
    sweep, errors = read_sweep(overrides)
    assert errors == [] and sweep.settings.params == {"seed": "1,abc"}
    checks = _Checks()
    sweep_errors(overrides, checks.check, checks.compose)
    assert checks.checked == [["seed=1,abc", "max_steps=2"]]  # each of its values is checked
