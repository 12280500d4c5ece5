"""Every model's state: 0-d tensors, buffers, tied weights and non-float entries go through the
weights digest, checkpoints, the safetensors export and init_from (nanoGPT's `_orig_mod.` keys too)."""

from __future__ import annotations

import pytest
import torch

from clorch.checkpoint import load_checkpoint, save_checkpoint
from clorch.checkpoint.weights import load_weights, read_weights, save_safetensors
from clorch.strategies import weights_digest
from clorch.models.resnet import ResNet
from tests.models.state_models import NormDropoutNet

pytestmark = pytest.mark.timeout(60)


def _resnet(seed: int) -> ResNet:
    torch.manual_seed(seed)
    return ResNet(num_classes=3, layers=(1, 1), width=4)


def _norm_net(seed: int) -> NormDropoutNet:
    torch.manual_seed(seed)
    return NormDropoutNet()


def _trained(model: torch.nn.Module) -> torch.nn.Module:
    """A few train-mode forwards: BatchNorm's statistics and counter move off their start."""
    shape = (6, 3, 8, 8) if isinstance(model, ResNet) else (6, 8)
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(shape))
        for module in model.modules():
            if isinstance(module, NormDropoutNet):
                module.scale.fill_(1.5)
    return model


@pytest.fixture(params=["resnet", "norm_net"])
def models(request):
    """A trained model and a fresh one of the same architecture with other weights."""
    build = _resnet if request.param == "resnet" else _norm_net
    return _trained(build(0)), build(1)


def test_the_digest_counts_0d_int_and_bool_state(models):
    model, _ = models
    state = model.state_dict()
    assert any(t.dim() == 0 and t.dtype == torch.int64 for t in state.values())  # num_batches_tracked
    before = weights_digest(model)
    assert before == weights_digest(model)
    counter = next(b for name, b in model.named_buffers() if name.endswith("num_batches_tracked"))
    counter += 1
    assert weights_digest(model) != before
    counter -= 1
    assert weights_digest(model) == before


def test_the_digest_counts_a_learnable_scalar_and_a_bool_buffer():
    model = _norm_net(0)
    before = weights_digest(model)
    with torch.no_grad():
        model.scale.fill_(2.0)
    assert weights_digest(model) != before
    model.scale.data.fill_(1.0)
    model.mask[0] = False
    assert weights_digest(model) != before


def test_export_and_init_from_keep_every_entry(models, tmp_path):
    model, fresh = models
    assert weights_digest(model) != weights_digest(fresh)
    path = save_safetensors(model, tmp_path / "model.safetensors")
    assert set(read_weights(path)) == set(model.state_dict())
    load_weights(fresh, path)
    assert weights_digest(fresh) == weights_digest(model)
    for name, value in fresh.state_dict().items():
        assert value.dtype == model.state_dict()[name].dtype, name
    if isinstance(fresh, NormDropoutNet):  # still one parameter under two names
        assert fresh.mix2.weight is fresh.mix1.weight


def test_a_checkpoint_round_trip_keeps_every_entry(models, tmp_path):
    model, fresh = models
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn((4, 3, 8, 8) if isinstance(model, ResNet) else (4, 8))).sum().backward()
    optimizer.step()  # the learnable scalar gets 0-d optimizer state too
    path = save_checkpoint(tmp_path / "c.ckpt", model=model, optimizer=optimizer)
    other = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    load_checkpoint(path, model=fresh, optimizer=other)
    assert weights_digest(fresh) == weights_digest(model)
    load_weights(_resnet(2) if isinstance(model, ResNet) else _norm_net(2), path)  # init_from a checkpoint


@pytest.mark.parametrize("prefix", ["_orig_mod.", "module._orig_mod.", "_orig_mod.module."])
def test_init_from_takes_torch_compile_prefixed_keys(tmp_path, prefix):
    """nanoGPT's checkpoint: {"model": state dict of the compiled model, ...}, keys `_orig_mod.`..."""
    model, fresh = _trained(_norm_net(0)), _norm_net(1)
    torch.save(
        {
            "model": {prefix + k: v for k, v in model.state_dict().items()},
            "iter_num": 5,
            "best_val_loss": torch.tensor(2.5),
            "config": {"n_layer": 2},
        },
        tmp_path / "ckpt.pt",
    )
    load_weights(fresh, tmp_path / "ckpt.pt")
    assert weights_digest(fresh) == weights_digest(model)


def test_a_key_that_only_starts_like_a_prefix_is_kept(tmp_path):
    """Only a prefix on every key is a wrapper's."""
    torch.save({"_orig_mod.a": torch.zeros(1), "b": torch.ones(1)}, tmp_path / "w.pt")
    assert set(read_weights(tmp_path / "w.pt")) == {"_orig_mod.a", "b"}


def test_resnet_is_torchvision_shaped():
    model = ResNet(num_classes=5, in_channels=1, layers=(2, 1), width=8, small_input=False)
    assert model(torch.randn(2, 1, 32, 32)).shape == (2, 5)
    assert [m.stride for m in (model.stages[1][0].conv1,)] == [(2, 2)]
    with pytest.raises(ValueError, match=r"ResNet.layers\[1\] must be a positive int, got 0"):
        ResNet(layers=(2, 0))
