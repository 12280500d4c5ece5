"""Hydra's override slips are config errors: exit 2, clorch's wording with the fix, nothing left behind.

`+key` on a key the config has, `+group` / `++group` on a group (every group is in
the defaults list), `~key` on a key it lacks or with the wrong value, an unknown
group option and an override that does not parse.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clorch.config.overrides import check_overrides
from tests.clirunner import run_clorch_train, run_clorch_train_batch

pytestmark = pytest.mark.timeout(240)
ROOT = Path(__file__).resolve().parents[2]

# (the override, words the error must have: the override itself and the fix)
SLIPS = [
    ("+epochs=3", ["+epochs=3", "set it with epochs=3"]),
    ("+model.hidden_features=3", ["+model.hidden_features=3", "set it with model.hidden_features=3"]),
    ("+optim=sgd", ["+optim=sgd", "choose another option with optim=sgd"]),
    ("++optim=sgd", ["++optim=sgd", "choose another option with optim=sgd"]),
    ("~model.hidden_feature", ["~model.hidden_feature", "did you mean hidden_features?"]),
    ("~nokey", ["~nokey", "no key nokey to delete"]),
    ("~optim.lr=0.5", ["~optim.lr=0.5", "optim.lr is 0.003, not 0.5", "write ~optim.lr"]),
    ("optim=adamx", ["optim=adamx is not allowed", "did you mean adamw?"]),
    ("optim.betas=[0.9", ["'optim.betas=[0.9' is not a valid override", "needs quotes"]),
]


@pytest.mark.parametrize("override, words", SLIPS, ids=[s[0] for s in SLIPS])
def test_each_slip_is_one_error_with_its_fix(override, words):
    errors = check_overrides(["+recipe=cpu_smoke", override])
    assert len(errors) == 1, errors
    for word in words:
        assert word in errors[0], errors
    assert "Hydra" not in errors[0] and "override /" not in errors[0]


def test_the_slips_still_compose_what_was_meant_so_other_errors_are_found():
    errors = check_overrides(["+recipe=cpu_smoke", "+epochs=3", "+optim=sgd", "optim.momentum=2"])
    assert any(e.startswith("+epochs=3") for e in errors) and any(e.startswith("+optim=sgd") for e in errors)
    assert not any("momentum" in e and "not a known key" in e for e in errors), errors  # sgd was composed


def test_adding_a_new_key_and_deleting_an_existing_one_are_no_slips():
    assert check_overrides(["+recipe=cpu_smoke", "++epochs=3"]) == []
    errors = check_overrides(["+recipe=cpu_smoke", "+model.width=3", "~optim.lr"])
    assert any("model.width is not a known key" in e for e in errors), errors
    assert any("optim.lr is missing" in e for e in errors), errors
    assert not any("in the config already" in e or "no key" in e for e in errors), errors


CLI_SLIPS = [
    "+epochs=3",
    "+optim=sgd",
    "++optim=sgd",
    "~model.nokey=3",
    "~nokey",
    "~optim.lr=0.5",
    "optim=adamx",
    "optim.betas=[0.9",
]


@pytest.fixture(scope="module")
def cli_slips(tmp_path_factory) -> dict[str, tuple]:
    """{override: (clorch-train's result, its working directory)}: every slip through clorch-train's
    own entry point, one after the other in one process (each takes the same path: the overrides
    are checked before Hydra runs, exit 2), each in an empty directory of its own."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    dirs = [tmp_path_factory.mktemp("slip") for _ in CLI_SLIPS]
    done = run_clorch_train_batch([(["+recipe=cpu_smoke", o], d) for o, d in zip(CLI_SLIPS, dirs)], env, timeout=200)
    return {override: (result, where) for override, result, where in zip(CLI_SLIPS, done, dirs)}


@pytest.mark.parametrize("override", CLI_SLIPS)
def test_clorch_train_exits_2_naming_the_fix_and_leaves_no_run_directory(override, cli_slips):
    done, tmp_path = cli_slips[override]
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "config error" in done.stderr and override.split("=")[0] in done.stderr
    assert "HYDRA_FULL_ERROR" not in done.stderr + done.stdout
    assert list(tmp_path.iterdir()) == [], "a run directory was left behind"


def test_a_sweep_cannot_print_its_config_instead_of_running(tmp_path):
    """Hydra runs one mode (run, multirun or print): -m with --cfg is a config error, not a traceback."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = run_clorch_train(["-m", "--cfg", "job", "+recipe=cpu_smoke", "epochs=1,2"], tmp_path, env=env, timeout=120)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "--cfg prints one config and cannot run with -m" in done.stderr
    assert list(tmp_path.iterdir()) == []
