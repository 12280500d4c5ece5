"""Reading Hydra's command-line flags as clorch-train does (no Hydra run)."""

from __future__ import annotations

import pytest

from clorch.cli.hydra_flags import flag_set, is_override, mode_errors, whole_flags

pytestmark = pytest.mark.timeout(30)


def test_unique_prefixes_are_written_in_full():
    args, errors = whole_flags(["--multi", "--cfg=job", "--res", "optim.lr=1"])
    assert errors == []
    assert args == ["--multirun", "--cfg=job", "--resolve", "optim.lr=1"]


def test_ambiguous_unknown_and_run_together_flags_are_refused():
    _, errors = whole_flags(["--r", "--nosuch", "-mcjob", "-c=job", "-m"])
    assert len(errors) == 3
    assert errors[0] == "--r is ambiguous: it could be --resolve, --run"
    assert errors[1].startswith("--nosuch is not a clorch-train flag")
    assert errors[2].startswith("-mcjob: write each short flag and its value separately")


def test_what_follows_a_double_dash_is_overrides_only():
    args, errors = whole_flags(["-m", "--", "optim.lr=1,2", "--cfg"])
    assert args == ["-m", "optim.lr=1,2"]
    assert errors == [
        "--cfg comes after '--', so it would be read as an override, and an override "
        "cannot start with '-': put flags before '--'"
    ]


def test_overrides_are_read_apart_from_flags_and_their_values():
    args = [
        "+recipe=x",
        "-m",
        "optim.lr=1,2",
        "--cfg",
        "a=b",
        "--pack=p",
        "~model",
        "-sc",
        "install=bash",
        "--cf",
        "job",
    ]
    overrides = [arg for i, arg in enumerate(args) if is_override(args, i)]
    assert overrides == ["+recipe=x", "optim.lr=1,2", "~model", "install=bash"]  # `--cfg a=b`: --cfg's value
    flags, errors = whole_flags([arg for i, arg in enumerate(args) if not is_override(args, i)])
    assert flags == ["-m", "--cfg", "a=b", "--package=p", "-sc", "--cfg", "job"] and errors == []
    assert flag_set(flags) == {"-m", "--cfg", "--package", "-sc"}


def test_more_than_one_of_hydras_modes_is_named():
    assert mode_errors({"-m", "--resolve"}) == [] and mode_errors({"--cfg"}) == []
    assert mode_errors({"-m", "--cfg"}) == [
        "--cfg prints one config and cannot run with -m (a sweep): drop one of the two"
    ]
    assert mode_errors({"-sc", "-r"}) == [
        "-sc sets up shell completion and cannot run with -r (a single run): drop one of the two"
    ]
