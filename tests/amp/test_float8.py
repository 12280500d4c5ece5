"""precision=fp8's layer rule (names and shapes only) and, where torchao imports, the conversion on CPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from clorch.config.options.precision import FP8Config
from clorch.amp.float8 import (
    LinearShape,
    carry_module_attributes,
    choose_float8_layers,
    convert_to_float8,
    linear_shapes,
)
from clorch.models.gpt import GPT, GPTConfig
from clorch.nn.parallel.fsdp_init import init_fn_of, materialize
from clorch.precision import DTYPE_NAMES, get_precision


def _gpt_layers(d_model, n_layer=2, vocab=50304):
    """A GPT's Linear layers as `linear_shapes` lists them (blocks first, lm_head last)."""
    layers = []
    for i in range(n_layer):
        p = f"blocks.{i}"
        layers += [
            LinearShape(f"{p}.attn.qkv", d_model, 3 * d_model),
            LinearShape(f"{p}.attn.proj", d_model, d_model),
            LinearShape(f"{p}.mlp.fc", d_model, 4 * d_model),
            LinearShape(f"{p}.mlp.proj", 4 * d_model, d_model),
        ]
    return layers + [LinearShape("lm_head", d_model, vocab)]


def test_gpt2_small_keeps_every_layer_high_precision_by_default():
    assert choose_float8_layers(_gpt_layers(768)) == []  # 768 < 1024: float8 would be slower there


def test_a_1b_gpt_converts_its_blocks_but_not_the_ends():
    chosen = choose_float8_layers(_gpt_layers(2048))
    assert "lm_head" not in chosen and "blocks.0.attn.qkv" not in chosen
    assert chosen == [x.name for x in _gpt_layers(2048)[1:-1]]


def test_min_features_skip_and_ends():
    layers = _gpt_layers(768)
    every = choose_float8_layers(layers, min_features=16, keep_ends=False)
    assert every == [x.name for x in layers]
    assert "lm_head" not in choose_float8_layers(layers, min_features=16, skip=["lm_*"], keep_ends=False)
    assert choose_float8_layers(layers, min_features=16, skip=["*.attn.*"]) == [
        "blocks.0.mlp.fc",
        "blocks.0.mlp.proj",
        "blocks.1.mlp.fc",
        "blocks.1.mlp.proj",
    ]


def test_sizes_not_divisible_by_16_stay_high_precision():
    layers = [
        LinearShape("a", 32, 32),
        LinearShape("b", 1040, 2048),
        LinearShape("c", 2048, 1030),
        LinearShape("d", 8, 8),
    ]
    assert choose_float8_layers(layers, min_features=16, keep_ends=False) == ["a", "b"]
    assert choose_float8_layers([], min_features=16) == []
    with pytest.raises(ValueError, match="min_features must be an int >= 1"):
        choose_float8_layers(layers, min_features=0)


def test_linear_shapes_reads_a_model_in_registration_order():
    model = GPT(GPTConfig(vocab_size=64, seq_len=8, n_layer=1, n_head=2, d_model=32))
    assert [x.name for x in linear_shapes(model)] == [x.name for x in _gpt_layers(32, n_layer=1, vocab=64)]


def test_fp8_is_a_config_option_that_runs_in_bf16_and_no_dtype_name():
    fp8 = FP8Config()
    assert fp8.runs_as == "bf16" and fp8.scaler_settings() is None
    assert fp8.describe("cuda") == "float8 Linear layers (tensorwise scaling) with bf16 autocast"
    assert "fp8" not in DTYPE_NAMES  # never a reduce_dtype nor an autocast dtype
    with pytest.raises(ValueError, match="got 'fp8'"):
        get_precision("fp8")  # the library's modes are dtypes; float8 is a change to the model


def test_conversion_keeps_the_state_dict_where_torchao_imports():
    pytest.importorskip("torchao.float8")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 64), nn.Linear(64, 48), nn.Linear(48, 16))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    converted = convert_to_float8(model, recipe="rowwise", min_features=16)
    assert converted == ["1", "2"]
    assert type(model[1]).__name__ == "Float8Linear" and type(model[0]) is nn.Linear
    after = model.state_dict()
    assert list(after) == list(before)
    for key, value in before.items():
        assert torch.equal(after[key], value), key


def _meta_gpt() -> GPT:
    with torch.device("meta"):
        return GPT(GPTConfig(vocab_size=64, seq_len=8, n_layer=2, n_head=2, d_model=32))


class _SwappedLinear(nn.Linear):
    """What a conversion such as torchao's `Float8Linear.from_float` puts in a layer's place:
    a new module holding the old one's weight and bias, and none of its other attributes."""

    @classmethod
    def replacing(cls, old: nn.Linear) -> "_SwappedLinear":
        with torch.device("meta"):
            new = cls(old.in_features, old.out_features, bias=False)
        new.weight, new.bias = old.weight, old.bias
        return new


def test_a_swapped_layer_keeps_its_tags_and_a_meta_built_gpt_its_initial_weights():
    # A GPT built on the meta device (parallel=fsdp) is initialized after its layers are
    # swapped: the residual projections must keep the tag that scales their initial std.
    plain, swapped = _meta_gpt(), _meta_gpt()
    replaced = {}
    for name, module in list(swapped.named_modules()):
        if isinstance(module, nn.Linear) and name != "lm_head":
            replaced[name] = module
            parent, _, child = name.rpartition(".")
            setattr(swapped.get_submodule(parent), child, _SwappedLinear.replacing(module))
    assert not hasattr(swapped.blocks[0].attn.proj, "is_residual_projection")
    carry_module_attributes(swapped, replaced)
    assert swapped.blocks[0].attn.proj.is_residual_projection is True
    assert not hasattr(swapped.blocks[0].attn.qkv, "is_residual_projection")
    for model in (plain, swapped):
        materialize(model, "cpu", seed=3, init_fn=init_fn_of(model))
    want, got = plain.state_dict(), swapped.state_dict()
    assert list(got) == list(want)
    for key, value in want.items():
        assert torch.equal(got[key], value), key


def test_a_meta_built_gpt_starts_from_the_bf16_weights_after_float8_conversion():
    pytest.importorskip("torchao.float8")
    plain, fp8 = _meta_gpt(), _meta_gpt()
    converted = convert_to_float8(fp8, min_features=16)
    assert "blocks.1.mlp.proj" in converted and type(fp8.blocks[1].mlp.proj).__name__ == "Float8Linear"
    for model in (plain, fp8):
        materialize(model, "cpu", seed=3, init_fn=init_fn_of(model))
    assert fp8.lm_head.weight is fp8.tok_emb.weight
    want, got = plain.state_dict(), fp8.state_dict()
    assert list(got) == list(want)
    for key, value in want.items():
        assert torch.equal(got[key], value), key
