"""Your own dataset, loss, step and starting weights: every mistake is a config error before launch,
naming the key, the value and what is allowed (the plan tries a batch on the CPU)."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from clorch.config.overrides import check_overrides
from clorch.config.plan import resolve_errors

pytestmark = pytest.mark.timeout(120)
BLOBS = ["+recipe=cpu_smoke", "data._target_=clorch.data.datasets.Blobs"]


def _errors(*overrides: str) -> list[str]:
    return check_overrides(list(overrides), resolve_errors)


def _one(errors: list[str], *parts: str) -> str:
    found = [e for e in errors if all(p in e for p in parts)]
    assert found, errors
    return found[0]


@pytest.fixture
def user_pkg(tmp_path, monkeypatch):
    """A package `userpkg` in the working directory, trusted the way a user trusts it."""
    (tmp_path / "userpkg").mkdir()
    (tmp_path / "userpkg" / "__init__.py").write_text(textwrap.dedent('''
        import torch
        from torch.utils.data import Dataset, IterableDataset

        class Stream(IterableDataset):
            def __iter__(self):
                yield torch.randn(3), 0

        class Ragged(Dataset):
            def __len__(self):
                return 8
            def __getitem__(self, i):
                return torch.randn(i + 1), 0

        class Empty(Dataset):
            def __init__(self, split):
                self.split = split
            def __len__(self):
                return 0
            def __getitem__(self, i):
                raise IndexError(i)

        def bad_loss(outputs, targets):
            return (outputs - 1).abs()  # not reduced: a tensor per sample
    '''))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CLORCH_TRUSTED_MODULES", "userpkg")
    yield
    for name in [m for m in sys.modules if m == "userpkg" or m.startswith("userpkg.")]:
        del sys.modules[name]


def test_a_dataset_of_your_own_trains_with_a_builtin_model_and_a_named_loss():
    assert _errors(*BLOBS, "loss=cross_entropy") == []
    assert _errors(*BLOBS, "step._target_=clorch.data.datasets.classification_step",
                   "step.label_smoothing=0.1") == []


def test_loss_and_step_mistakes_are_named():
    _one(_errors(*BLOBS), "data._target_=clorch.data.datasets.Blobs needs a loss", "loss=cross_entropy")
    _one(_errors("+recipe=cpu_smoke", "loss=mse"), "loss=mse applies to a dataset of your own")
    _one(_errors(*BLOBS, "loss=mse", "step._target_=clorch.data.datasets.classification_step"),
         "computes the loss itself")
    _one(_errors(*BLOBS, "loss=hinge"), "loss", "hinge")
    _one(_errors(*BLOBS, "loss=cross_entropy", "data.colour=3"),
         "data.colour=3 is not an argument of data._target_=clorch.data.datasets.Blobs",
         "its arguments: sample_count, features, classes, spread, seed")
    _one(_errors(*BLOBS, "loss=cross_entropy", "data.featurs=3"),
         "data.featurs=3 is not an argument", "did you mean features? its arguments:")
    _one(_errors(*BLOBS, "loss=cross_entropy", "data.num_workers=-1"), "data.num_workers must be >= 0, got -1")
    _one(_errors(*BLOBS, "loss=cross_entropy", "data.persistent_workers=true"),
         "data.persistent_workers=True needs worker processes")
    _one(_errors(*BLOBS, "step._target_=clorch.data.datasets.classification_step", "step.batch=1"),
         "step.batch is passed by clorch")
    _one(_errors(*BLOBS, "loss._target_=torch.nn.functional.cross_entropy", "loss.gama=2"),
         "loss.gama=2 is not an argument of loss._target_=torch.nn.functional.cross_entropy")


def test_a_batch_that_does_not_fit_is_named_before_launch(user_pkg):
    _one(_errors(*BLOBS, "loss=cross_entropy", "model._target_=torch.nn.Linear", "model.in_features=3"),
         "data._target_=clorch.data.datasets.Blobs: a batch of items [0, 1] does not fit",
         "tried on the CPU before launch")
    _one(_errors("+recipe=cpu_smoke", "data._target_=userpkg.Stream", "loss=mse"),
         "IterableDataset", "map-style")
    _one(_errors("+recipe=cpu_smoke", "data._target_=userpkg.Ragged", "loss=mse"),
         "items [0, 1] do not make a batch with default_collate")
    _one(_errors("+recipe=cpu_smoke", "data._target_=userpkg.Empty", "loss=mse"),
         "data._target_=userpkg.Empty")
    _one(_errors(*BLOBS, "loss._target_=userpkg.bad_loss"), "the loss must be a 0-d tensor")
    _one(_errors(*BLOBS, "loss=cross_entropy", "data._target_=userpkg.Nope"),
         "data._target_='userpkg.Nope' does not import")


def test_init_from_is_checked_against_the_model(tmp_path):
    from clorch.models import MLP

    good = tmp_path / "good.pt"
    torch.save(MLP(in_features=8, out_features=4, hidden_features=16).state_dict(), good)
    wider = tmp_path / "wider.pt"
    torch.save(MLP(in_features=8, out_features=4, hidden_features=32).state_dict(), wider)
    assert _errors("+recipe=cpu_smoke", f"model.init_from={good}") == []
    _one(_errors("+recipe=cpu_smoke", f"model.init_from={wider}"), f"model.init_from={wider}", "shape")
    _one(_errors("+recipe=cpu_smoke", f"model.init_from={tmp_path / 'missing.pt'}"), "missing.pt")
