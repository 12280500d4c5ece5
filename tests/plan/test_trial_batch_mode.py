"""The batch tried before launch runs the model in train mode, as training does, whatever mode
the model's factory returned it in: a model whose forward differs by mode is checked on the
path it trains on (torchvision's Inception returns its auxiliary logits only in train mode)."""

from __future__ import annotations

import sys

import pytest

from clorch.config.overrides import check_overrides
from clorch.plan.plan import resolve_errors

pytestmark = pytest.mark.timeout(120)

CODE = '''
from torch import nn

class Aux(nn.Module):
    """An auxiliary head used in train mode only; `pair`: returned beside the logits, as
    Inception does (which a plain loss cannot take), else added to them."""
    def __init__(self, in_features, out_features, pair=False):
        super().__init__()
        self.main = nn.Linear(in_features, out_features)
        self.aux = nn.Linear(in_features, out_features)
        self.pair = pair

    def forward(self, x):
        out = self.main(x)
        if not self.training:
            return out
        return (out, self.aux(x)) if self.pair else out + self.aux(x)

def evaluating(in_features, out_features, pair=False):
    """A factory that returns its model in eval mode (as a model loaded for inference is)."""
    return Aux(in_features, out_features, pair).eval()
'''

SMOKE = ["+recipe=cpu_smoke", "max_steps=2", "++model._target_=modechk.evaluating"]


@pytest.fixture
def user_code(tmp_path, monkeypatch):
    (tmp_path / "modechk").mkdir()
    (tmp_path / "modechk" / "__init__.py").write_text(CODE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CLORCH_TRUSTED_MODULES", "modechk")
    yield
    sys.modules.pop("modechk", None)


def _errors(*overrides: str) -> list[str]:
    return check_overrides([*SMOKE, *overrides], resolve_errors)


def test_a_head_used_only_in_train_mode_gets_its_gradient_in_the_trial(user_code):
    # In eval mode the auxiliary head would get no gradient, and parallel=ddp would refuse it.
    assert _errors() == []


def test_a_training_forward_the_loss_cannot_take_is_refused_before_launch(user_code):
    (error,) = _errors("++model.pair=true")
    assert error.startswith("model._target_=modechk.evaluating: a batch of data=synthetic"), error
    assert "tried before launch" in error and "tuple" in error, error
