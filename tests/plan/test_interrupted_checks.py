"""Ctrl-C during the checks before launch ends the command as interrupted, never as a config error:
Python 3.11 wraps a KeyboardInterrupt raised while a class is created (a module being imported) in
a RuntimeError, which the checks' handlers of your code's errors must not report as your error."""

from __future__ import annotations

import sys

import pytest

from clorch.config.overrides import check_overrides
from clorch.plan.interrupted import interrupt_behind, reraise_interrupt
from clorch.plan.plan import resolve_errors

pytestmark = pytest.mark.timeout(120)

CODE = '''
from torch import nn
from torch.utils.data import Dataset

class _Interrupts:
    def __set_name__(self, owner, name):
        raise KeyboardInterrupt  # as a signal handler's raise lands here

def _make_class():
    class Made:  # Python 3.11: RuntimeError("Error calling __set_name__ ...") from the KeyboardInterrupt
        field = _Interrupts()

def interrupted_model(in_features, out_features):
    _make_class()

class InterruptedData(Dataset):
    def __init__(self):
        _make_class()
'''


@pytest.fixture
def user_code(tmp_path, monkeypatch):
    (tmp_path / "intchk").mkdir()
    (tmp_path / "intchk" / "__init__.py").write_text(CODE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CLORCH_TRUSTED_MODULES", "intchk")
    yield
    sys.modules.pop("intchk", None)


def test_the_interrupt_behind_a_wrapping_error_is_found_and_raised():
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise RuntimeError("Error calling __set_name__") from exc
    except RuntimeError as wrapped:
        assert isinstance(interrupt_behind(wrapped), KeyboardInterrupt)
        with pytest.raises(KeyboardInterrupt):
            reraise_interrupt(wrapped)
    reraise_interrupt(ValueError("an error of its own"))  # returns: reported as it is
    assert interrupt_behind(ValueError()) is None


@pytest.mark.parametrize(
    "overrides",
    [
        ["++model._target_=intchk.interrupted_model"],
        ["data._target_=intchk.InterruptedData", "loss=cross_entropy"],
    ],
    ids=["model", "data"],
)
def test_an_interrupt_wrapped_while_your_code_runs_is_not_a_config_error(user_code, overrides):
    with pytest.raises(KeyboardInterrupt):
        errors = check_overrides(["+recipe=cpu_smoke", "max_steps=2", *overrides], resolve_errors)
        pytest.fail(f"reported as config errors: {errors}")
