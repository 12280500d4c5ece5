"""TrainConfig holds one field per group the registry declares (TrainConfig.from_dict builds one per group)."""

from __future__ import annotations

import dataclasses

import pytest

from clorch.config import registry
from clorch.config.schema import TopConfig, TrainConfig

pytestmark = pytest.mark.timeout(60)


def test_train_config_has_a_field_for_every_declared_group_and_no_other():
    top = {f.name for f in dataclasses.fields(TopConfig)}
    assert {f.name for f in dataclasses.fields(TrainConfig)} - top == set(registry.groups())
