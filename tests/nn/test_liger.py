"""model.liger=true: which models Liger-Kernel is applied to (the patching itself is in the cuda tier)."""

from __future__ import annotations

import pytest
from torch import nn

from clorch.nn.liger import LIGER_ARCHITECTURES, apply_liger, architecture, unsupported


def test_an_unsupported_architecture_is_refused_naming_the_supported_ones():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=16)
    model = transformers.GPT2LMHeadModel(config)
    assert architecture(model) == "gpt2"
    with pytest.raises(ValueError, match="supports Hugging Face models of type llama, mistral.*model_type 'gpt2'"):
        apply_liger(model)


def test_a_model_without_a_hugging_face_config_is_refused():
    message = unsupported(nn.Linear(2, 2))
    assert message.startswith("model.liger=true supports Hugging Face models of type " + ", ".join(LIGER_ARCHITECTURES))
    assert "a Linear, no Hugging Face model" in message


def test_a_llama_is_supported():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    assert unsupported(transformers.LlamaForCausalLM(config)) is None
