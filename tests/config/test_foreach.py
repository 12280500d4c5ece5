"""optim.foreach: one key in the optimizers' options reaches torch's optimizer."""

from __future__ import annotations

import pytest
import torch

from clorch.config import check_config, compose
from clorch.config.schema import TrainConfig
from clorch.config.checks import to_plain
from clorch.train.components import build_optimizer


@pytest.mark.parametrize("optim", ["adamw", "sgd"])
def test_foreach_reaches_the_optimizer(optim):
    cfg = compose([f"optim={optim}", "optim.foreach=false"])
    assert check_config(cfg) == []
    built = build_optimizer(TrainConfig.from_dict(to_plain(cfg)), torch.nn.Linear(4, 2))
    assert built.defaults["foreach"] is False


def test_foreach_takes_a_bool_or_null():
    errors = check_config(compose(["optim.foreach=maybe"]))
    assert len(errors) == 1 and "optim.foreach" in errors[0] and "maybe" in errors[0]
