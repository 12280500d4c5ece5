"""Your own dataset, loss, step and starting weights: every mistake is a config error before launch,
naming the key, the value and what is allowed (the plan tries a batch on the CPU)."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from clorch.config.overrides import check_overrides
from clorch.plan.plan import resolve_errors

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
    (tmp_path / "userpkg" / "__init__.py").write_text(
        textwrap.dedent('''
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
    ''')
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CLORCH_TRUSTED_MODULES", "userpkg")
    yield
    for name in [m for m in sys.modules if m == "userpkg" or m.startswith("userpkg.")]:
        del sys.modules[name]


def test_a_dataset_of_your_own_trains_with_a_builtin_model_and_a_named_loss():
    assert _errors(*BLOBS, "loss=cross_entropy") == []
    assert _errors(*BLOBS, "step._target_=clorch.data.datasets.classification_step", "step.label_smoothing=0.1") == []


def test_loss_and_step_mistakes_are_named():
    _one(_errors(*BLOBS), "data._target_=clorch.data.datasets.Blobs needs a loss", "loss=cross_entropy")
    _one(_errors("+recipe=cpu_smoke", "loss=mse"), "loss=mse applies to a dataset of your own")
    _one(
        _errors(*BLOBS, "loss=mse", "step._target_=clorch.data.datasets.classification_step"),
        "computes the loss itself",
    )
    _one(_errors(*BLOBS, "loss=hinge"), "loss", "hinge")
    _one(
        _errors(*BLOBS, "loss=cross_entropy", "data.colour=3"),
        "data.colour=3 is not an argument of data._target_=clorch.data.datasets.Blobs",
        "its arguments: sample_count, features, classes, spread, seed",
    )
    _one(
        _errors(*BLOBS, "loss=cross_entropy", "data.featurs=3"),
        "data.featurs=3 is not an argument",
        "did you mean features? its arguments:",
    )
    _one(_errors(*BLOBS, "loss=cross_entropy", "data.num_workers=-1"), "data.num_workers must be >= 0, got -1")
    _one(
        _errors(*BLOBS, "loss=cross_entropy", "data.persistent_workers=true"),
        "data.persistent_workers=True needs worker processes",
    )
    _one(
        _errors(*BLOBS, "step._target_=clorch.data.datasets.classification_step", "step.batch=1"),
        "step.batch is passed by clorch",
    )
    _one(
        _errors(*BLOBS, "loss._target_=torch.nn.functional.cross_entropy", "loss.gama=2"),
        "loss.gama=2 is not an argument of loss._target_=torch.nn.functional.cross_entropy",
    )


def test_a_batch_that_does_not_fit_is_named_before_launch(user_pkg):
    _one(
        _errors(*BLOBS, "loss=cross_entropy", "model._target_=torch.nn.Linear", "model.in_features=3"),
        "data._target_=clorch.data.datasets.Blobs: a batch of items [0, 1] does not fit",
        "tried on the CPU before launch",
    )
    _one(_errors("+recipe=cpu_smoke", "data._target_=userpkg.Stream", "loss=mse"), "IterableDataset", "map-style")
    _one(
        _errors("+recipe=cpu_smoke", "data._target_=userpkg.Ragged", "loss=mse"),
        "items [0, 1] do not make a batch with default_collate",
    )
    _one(_errors("+recipe=cpu_smoke", "data._target_=userpkg.Empty", "loss=mse"), "data._target_=userpkg.Empty")
    _one(_errors(*BLOBS, "loss._target_=userpkg.bad_loss"), "the loss must be a 0-d tensor")
    _one(
        _errors(*BLOBS, "loss=cross_entropy", "data._target_=userpkg.Nope"),
        "data._target_='userpkg.Nope' does not import",
    )


def test_init_from_is_checked_against_the_model(tmp_path):
    from clorch.models import MLP

    good = tmp_path / "good.pt"
    torch.save(MLP(in_features=8, out_features=4, hidden_features=16).state_dict(), good)
    wider = tmp_path / "wider.pt"
    torch.save(MLP(in_features=8, out_features=4, hidden_features=32).state_dict(), wider)
    assert _errors("+recipe=cpu_smoke", f"model.init_from={good}") == []
    _one(_errors("+recipe=cpu_smoke", f"model.init_from={wider}"), f"model.init_from={wider}", "shape")
    _one(_errors("+recipe=cpu_smoke", f"model.init_from={tmp_path / 'missing.pt'}"), "missing.pt")


# --- models built from nested objects, factories, and the model's own loss ------------------------
NESTED = '''
import dataclasses
import torch
from torch import nn

@dataclasses.dataclass
class Cfg:
    width: int = 4
    out: int = 4

class Net(nn.Module):
    """Net(config): its constructor takes a config object, as nanoGPT's GPT and HF's models do."""
    def __init__(self, config, in_features=8):
        super().__init__()
        self.layer = nn.Linear(in_features, config.out)

    @classmethod
    def from_width(cls, width, **kwargs):
        return cls(Cfg(width=width), **kwargs)

    def forward(self, x):
        return self.layer(x)

def make_net(**kwargs):
    """A factory: it forwards **kwargs, so the data's sizes must not reach it."""
    if kwargs:
        raise TypeError(f"unexpected {sorted(kwargs)}")
    return Net(Cfg())

class Picky(nn.Module):
    def __init__(self, in_features):
        super().__init__()
        self.layer = nn.Linear(in_features, 4)

    def forward(self, x):
        assert x.shape[1] == 3
        return self.layer(x)

class OwnLoss(nn.Module):
    """Returns (outputs, loss) with a target, as nanoGPT's GPT.forward(idx, targets) does."""
    def __init__(self, in_features, out_features):
        super().__init__()
        self.layer = nn.Linear(in_features, out_features)

    def forward(self, x, targets=None):
        out = self.layer(x)
        return out, (None if targets is None else nn.functional.mse_loss(out, targets))

class TinyLM(nn.Module):
    """nanoGPT's interface: forward(idx, targets) returns (logits, loss), the loss over targets.view(-1)."""
    def __init__(self, vocab_size):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, vocab_size)

    def forward(self, idx, targets=None):
        logits = self.embed(idx)
        if targets is None:
            return logits, None
        return logits, nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

def lm_step(model, batch):
    return model(batch["input"], batch["target"])[1]
'''


@pytest.fixture
def nested_pkg(tmp_path, monkeypatch):
    (tmp_path / "nestedpkg").mkdir()
    (tmp_path / "nestedpkg" / "__init__.py").write_text(NESTED)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CLORCH_TRUSTED_MODULES", "nestedpkg")
    yield tmp_path / "nestedpkg" / "__init__.py"
    for name in [m for m in sys.modules if m == "nestedpkg" or m.startswith("nestedpkg.")]:
        del sys.modules[name]


def _line(path, text: str) -> str:
    """`file:line` of the first line of `path` holding `text`."""
    number = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)
    return f"{path}:{number}"


def test_nested_objects_and_factories_build_and_their_mistakes_are_named(nested_pkg):
    smoke = ["+recipe=cpu_smoke"]
    assert (
        _errors(
            *smoke, "++model._target_=nestedpkg.Net", "++model.config._target_=nestedpkg.Cfg", "++model.config.width=6"
        )
        == []
    )
    assert _errors(*smoke, "++model._target_=nestedpkg.Net.from_width", "++model.width=3") == []
    assert _errors(*smoke, "++model._target_=nestedpkg.make_net") == []  # no in_features through **kwargs
    # A dict where an object is needed: the key, the user's line, and the fix.
    found = _one(
        _errors(*smoke, "++model._target_=nestedpkg.Net", "++model.config.width=6"),
        "model._target_=nestedpkg.Net: cannot be built",
        "AttributeError",
    )
    assert "model.config is a plain mapping" in found and "model.config._target_=" in found
    # A wrong argument of the nested object names its key.
    _one(
        _errors(
            *smoke, "++model._target_=nestedpkg.Net", "++model.config._target_=nestedpkg.Cfg", "++model.config.widht=6"
        ),
        "model.config._target_=nestedpkg.Cfg: cannot be built",
        "widht",
    )
    # A nested target is trusted like any other.
    _one(
        _errors(*smoke, "++model._target_=nestedpkg.Net", "++model.config._target_=os.path.join"),
        "model.config._target_='os.path.join' is not allowed",
    )
    # A forward that fails on a batch of the data's shape: a bare assert shows its file and line.
    found = _one(
        _errors(*smoke, "++model._target_=nestedpkg.Picky"),
        "model._target_=nestedpkg.Picky",
        "does not run through",
        "AssertionError",
    )
    assert _line(nested_pkg, "assert x.shape[1] == 3") in found


def test_the_models_own_loss_trains_builtin_data_and_is_checked(nested_pkg):
    smoke = ["+recipe=cpu_smoke", "++model._target_=nestedpkg.OwnLoss"]
    assert _errors(*smoke, "loss=from_model") == []
    _one(_errors("+recipe=cpu_smoke", "loss=from_model"), "model=mlp returns only its outputs")
    _one(_errors(*smoke, "loss=from_model", "loss.target_arg=labels"), "unexpected keyword argument 'labels'")
    _one(
        _errors(*smoke, "loss=from_model", "step._target_=clorch.data.datasets.classification_step"),
        "computes the loss itself",
    )


def test_from_model_finds_the_loss_where_models_return_it():
    from clorch.data.from_model import FromModelStep, model_loss

    loss = torch.tensor(1.5)
    assert model_loss(loss) is loss
    assert model_loss((torch.ones(2, 3), loss)) is loss  # nanoGPT's (logits, loss)
    assert model_loss({"logits": torch.ones(2), "loss": loss}) is loss  # a ModelOutput is a dict too

    class Output:
        logits, loss = torch.ones(2), torch.tensor(0.5)

    assert model_loss(Output()).item() == 0.5
    for bad, words in [
        (torch.ones(3), "shape (3,)"),
        ((torch.ones(3), None), "holds no loss"),
        ((loss, loss), "2 0-d tensors"),
    ]:
        with pytest.raises(TypeError, match=words.replace("(", r"\(").replace(")", r"\)")):
            model_loss(bad)
    with pytest.raises(ValueError, match="loss.labels"):
        FromModelStep(labels="output")

    seen = {}

    def model(x, *args, **kwargs):
        seen.update(args=args, kwargs=kwargs)
        return loss

    batch = {"input": torch.zeros(2, 3), "target": torch.ones(2, 3)}
    FromModelStep()(model, batch)
    assert seen["args"][0] is batch["target"] and not seen["kwargs"]
    FromModelStep("labels", "input")(model, (batch["input"], batch["target"]))
    assert seen["kwargs"]["labels"] is batch["input"] and not seen["args"]


def test_from_model_is_huggingface_labels_semantics(tmp_path):
    transformers = pytest.importorskip("transformers")
    from clorch.data.from_model import FromModelStep, SteppedTask
    from clorch.data.tokens import TokenFileTask

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=32, n_positions=16, n_layer=1, n_head=2, n_embd=16, bos_token_id=None, eos_token_id=None
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    path = tmp_path / "train.bin"
    torch.randint(0, 32, (400,), dtype=torch.int32).numpy().astype("uint16").tofile(path)
    task = SteppedTask(TokenFileTask(str(path), seq_len=12, vocab_size=32), FromModelStep("labels", "input"))
    batch = task.batch([0, 1, 2])
    assert batch["input"].is_contiguous() and batch["target"].is_contiguous()
    with torch.no_grad():
        loss = task.loss(model, batch)
        own = model(batch["input"], labels=batch["input"]).loss
        logits = model(batch["input"]).logits
    assert torch.equal(loss, own)
    # HF shifts inside: position t predicts input[t + 1], i.e. clorch's target[t], for all but the last.
    shifted = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), batch["target"][:, :-1].flatten())
    torch.testing.assert_close(loss, shifted)
    sums = task.eval_sums(model, batch)
    assert sums["count"].item() == 3 and torch.isclose(sums["loss_sum"], own.double() * 3)


def test_a_factory_builds_a_pretrained_huggingface_model_from_a_local_folder(tmp_path):
    transformers = pytest.importorskip("transformers")

    config = transformers.GPT2Config(
        vocab_size=32, n_positions=16, n_layer=1, n_head=2, n_embd=16, bos_token_id=None, eos_token_id=None
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "tiny")
    tokens = tmp_path / "train.bin"
    torch.randint(0, 32, (400,), dtype=torch.int32).numpy().astype("uint16").tofile(tokens)
    lm = [
        "+recipe=cpu_smoke",
        "data=tokens",
        f"data.train_path={tokens}",
        "data.seq_len=12",
        "batch_size=4",
        "data.vocab_size=32",
        "loss=from_model",
        "loss.target_arg=labels",
        "loss.labels=input",
    ]
    # from_pretrained refuses the meta device: it is built and run once on the CPU instead, and
    # the data's seq_len and vocab_size do not reach it through its **kwargs.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CLORCH_TRUSTED_MODULES", "transformers")
        assert (
            _errors(
                *lm,
                "++model._target_=transformers.GPT2LMHeadModel.from_pretrained",
                f"++model.pretrained_model_name_or_path={tmp_path / 'tiny'}",
            )
            == []
        )
        _one(
            _errors(
                *lm,
                "++model._target_=transformers.GPT2LMHeadModel.from_pretrained",
                f"++model.pretrained_model_name_or_path={tmp_path / 'missing'}",
            ),
            "model._target_=transformers.GPT2LMHeadModel.from_pretrained: cannot be built",
        )


def test_token_files_train_a_model_of_your_own_with_its_loss_or_a_step(nested_pkg, tmp_path):
    tokens = tmp_path / "train.bin"
    torch.randint(0, 32, (400,), dtype=torch.int32).numpy().astype("uint16").tofile(tokens)
    lm = [
        "+recipe=cpu_smoke",
        "data=tokens",
        f"data.train_path={tokens}",
        "data.seq_len=12",
        "data.vocab_size=32",
        "batch_size=4",
        "++model._target_=nestedpkg.TinyLM",
    ]
    assert _errors(*lm, "loss=from_model") == []  # targets.view(-1): the batches are contiguous
    assert _errors(*lm, "step._target_=nestedpkg.lm_step") == []
    _one(_errors(*lm), "model._target_=nestedpkg.TinyLM: a batch of data=tokens", "loss=from_model")
