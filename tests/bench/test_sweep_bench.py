"""`clorch-bench sweep`'s plumbing: a trial's fixed cost against a plain script, on a tiny run."""

from __future__ import annotations

import json

import pytest

from clorch.bench.sweep import main

pytestmark = pytest.mark.timeout(180)


def test_the_fixed_cost_splits_a_trial_into_its_parts(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["--only", "cost", "--rounds", "1", "--steps", "2", "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)["fixed_cost"]
    parts = cost["before launch"] + cost["launch and rest"] + cost["training"]
    assert cost["before launch"] > 0 and cost["training"] > 0 and cost["plain total"] > 0
    assert parts == pytest.approx(cost["clorch total"])


def test_a_sweeps_fixed_cost_is_measured_against_one_fresh_process(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["--only", "trials", "--rounds", "1", "--trials", "2", "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)["trial_cost"]
    assert cost["trials"] == 2 and cost["plain s"] > 0 and cost["per trial s"] > 0
    assert sum(cost["phases"].values()) == pytest.approx(cost["sweep s"])
    assert cost["ratio"] == pytest.approx(cost["sweep s"] / cost["plain s"])
