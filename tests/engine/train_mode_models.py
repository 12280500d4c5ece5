"""A factory that hands its model back in eval mode, as Hugging Face's from_pretrained does.

Named by `model._target_=tests.engine.train_mode_models.evaluating` with CLORCH_TRUSTED_MODULES=tests.
"""

from __future__ import annotations

from torch import nn

from tests.models.state_models import NormDropoutNet


def evaluating(in_features: int, out_features: int, dropout: float = 0.5) -> nn.Module:
    """A NormDropoutNet (BatchNorm and dropout: both act otherwise in train mode) after `.eval()`."""
    return NormDropoutNet(in_features, out_features, dropout=dropout).eval()
