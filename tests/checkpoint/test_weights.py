"""Weights from clorch checkpoints, torch state dicts and safetensors files, checked before they load."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from clorch.checkpoint import save_checkpoint
from clorch.checkpoint.weights import (
    WeightsFileNotFoundError,
    fit_errors,
    load_weights,
    open_weights,
    read_weights,
    save_safetensors,
)

pytestmark = pytest.mark.timeout(60)


class _Net(torch.nn.Module):
    def __init__(self, width: int = 6) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(5, width)
        self.norm = torch.nn.BatchNorm1d(width)  # buffers too, one of them an int64
        self.head = torch.nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.norm(self.fc(x))))


class _TiedLM(torch.nn.Module):
    """A GPT's tying: the output matrix is the embedding matrix, one storage under two names."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(11, 4)
        self.out = torch.nn.Linear(4, 11, bias=False)
        self.out.weight = self.embed.weight


def _random(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """`model` with every tensor, buffers included, drawn at random (BatchNorm's start as zeros and ones)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.copy_(
                    torch.rand(tensor.shape, generator=generator) + 0.5
                    if tensor.dim() == 1
                    else torch.randn(tensor.shape, generator=generator)
                )
            else:
                tensor.fill_(int(torch.randint(2, 1000, (), generator=generator)))
    return model


def _equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]) for k in sa)


def _saved_checkpoint(tmp_path, model):
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 5)).sum().backward()
    optimizer.step()
    path = tmp_path / "run" / "step_3.ckpt"
    save_checkpoint(path, model=model, optimizer=optimizer, state={"step": 3})
    return path


def test_torch_state_dict_round_trip(tmp_path):
    source, fresh = _random(_Net(), 1), _random(_Net(), 2)
    path = tmp_path / "w.pt"
    torch.save(source.state_dict(), path)
    assert not _equal(source, fresh)
    load_weights(fresh, path)
    assert _equal(source, fresh)


def test_safetensors_round_trip(tmp_path):
    source, fresh = _random(_Net(), 1), _random(_Net(), 2)
    path = save_safetensors(source, tmp_path / "out" / "w.safetensors")
    assert path == tmp_path / "out" / "w.safetensors"
    assert os.listdir(path.parent) == ["w.safetensors"]  # no temporary left beside it
    load_weights(fresh, path)
    assert _equal(source, fresh)


def test_safetensors_found_by_content_without_the_suffix(tmp_path):
    source = _random(_Net(), 1)
    path = save_safetensors(source, tmp_path / "weights.bin")
    assert read_weights(path).keys() == source.state_dict().keys()


def test_clorch_checkpoint_round_trip(tmp_path):
    source, fresh = _random(_Net(), 1), _random(_Net(), 2)
    path = _saved_checkpoint(tmp_path, source)
    load_weights(fresh, path)
    assert _equal(source, fresh)


def test_corrupt_clorch_checkpoint_is_refused_naming_the_path(tmp_path):
    path = _saved_checkpoint(tmp_path, _random(_Net(), 1))
    archive_file = path.parent / json.loads(path.read_text())["archive"]["file"]
    data = bytearray(archive_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    archive_file.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupt") as caught:
        read_weights(path)
    assert str(path) in str(caught.value)


def test_ddp_prefix_is_stripped(tmp_path):
    source, fresh = _random(_Net(), 1), _random(_Net(), 2)
    path = tmp_path / "ddp.pt"
    torch.save({f"module.{k}": v for k, v in source.state_dict().items()}, path)
    assert set(read_weights(path)) == set(source.state_dict())
    load_weights(fresh, path)
    assert _equal(source, fresh)


@pytest.mark.parametrize("holder", ["state_dict", "model"])
def test_state_dict_held_under_a_key(tmp_path, holder):
    source, fresh = _random(_Net(), 1), _random(_Net(), 2)
    path = tmp_path / "lightning.ckpt"
    torch.save({holder: source.state_dict(), "epoch": 7, "optimizer_states": [{"lr": 0.1}]}, path)
    load_weights(fresh, path)
    assert _equal(source, fresh)


def test_state_dict_under_both_keys_is_ambiguous(tmp_path):
    state = _random(_Net(), 1).state_dict()
    path = tmp_path / "both.pt"
    torch.save({"model": state, "state_dict": state}, path)
    with pytest.raises(ValueError, match="ambiguous"):
        read_weights(path)


def _one_missing_one_extra(tmp_path):
    """(source, fresh, path): `path` holds source's weights less head.bias, plus extra.weight."""
    source, fresh = _random(_Net(), 1), _random(_Net(), 2)
    state = source.state_dict()
    del state["head.bias"]
    state["extra.weight"] = torch.randn(2, 2)
    path = tmp_path / "w.pt"
    torch.save(state, path)
    return source, fresh, path


def test_strict_refuses_missing_and_unexpected_keys_and_changes_nothing(tmp_path):
    source, fresh, path = _one_missing_one_extra(tmp_path)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(ValueError) as caught:
        load_weights(fresh, path)
    message = str(caught.value)
    assert str(path) in message
    assert "model.init_from: 1 key(s) of the model are missing from the file: head.bias" in message
    assert "model.init_from: 1 key(s) in the file are not in the model: extra.weight" in message
    assert all(torch.equal(before[k], v) for k, v in fresh.state_dict().items())


def test_non_strict_loads_what_is_there(tmp_path):
    source, fresh, path = _one_missing_one_extra(tmp_path)
    kept = fresh.head.bias.detach().clone()
    load_weights(fresh, path, strict=False)
    assert torch.equal(fresh.fc.weight, source.fc.weight)
    assert torch.equal(fresh.norm.running_var, source.norm.running_var)
    assert torch.equal(fresh.head.bias, kept)


def test_shape_mismatch_is_reported_even_non_strict(tmp_path):
    path = tmp_path / "wide.pt"
    torch.save(_random(_Net(width=8), 1).state_dict(), path)
    model = _random(_Net(width=6), 2)
    errors = fit_errors(model, read_weights(path), strict=False, key="model.init_from")
    assert len(errors) == 1
    assert errors[0].startswith(
        "model.init_from: 7 tensor(s) have another shape in the file than in the model: "
        "fc.weight (file (8, 5), model (6, 5)), fc.bias (file (8,), model (6,))"
    )
    assert "(2 more)" in errors[0]
    with pytest.raises(ValueError, match="another shape"):
        load_weights(model, path, strict=False)


def test_non_strict_refuses_a_file_sharing_no_key():
    errors = fit_errors(_Net(), {"encoder.weight": torch.randn(3)}, strict=False, key="k")
    assert len(errors) == 1 and errors[0].startswith("k: none of the file's 1 key(s) is a key of the model")


def test_long_lists_are_cut_with_a_count():
    errors = fit_errors(_Net(), {}, key="model.init_from")
    assert errors == [
        "model.init_from: 9 key(s) of the model are missing from the file: fc.weight, fc.bias, "
        "norm.weight, norm.bias, norm.running_mean, ... (4 more)"
    ]


def test_fit_errors_on_a_meta_device_model(tmp_path):
    path = save_safetensors(_random(_Net(), 1), tmp_path / "w.safetensors")
    weights = read_weights(path)
    with torch.device("meta"):
        model, wide = _Net(), _Net(width=8)
    assert fit_errors(model, weights) == []
    errors = fit_errors(wide, weights)
    assert len(errors) == 1 and errors[0].startswith("model.init_from: 7 tensor(s) have another shape")
    with pytest.raises(ValueError, match="meta device"):
        load_weights(model, path)


def test_file_dtype_is_cast_to_the_model_dtype(tmp_path):
    source, fresh = _random(_Net(), 1).double(), _random(_Net(), 2)
    path = tmp_path / "w64.pt"
    torch.save(source.state_dict(), path)
    load_weights(fresh, path)
    assert fresh.fc.weight.dtype == torch.float32
    assert torch.equal(fresh.fc.weight, source.fc.weight.float())


def test_ddp_wrapper_is_looked_through(tmp_path):
    source = _random(_Net(), 1)
    path = tmp_path / "w.pt"
    torch.save(source.state_dict(), path)

    class Wrapper(torch.nn.parallel.DistributedDataParallel):
        def __init__(self, module):  # no process group: only `module` matters here
            torch.nn.Module.__init__(self)
            self.module = module

    fresh = _random(_Net(), 2)
    load_weights(Wrapper(fresh), path)
    assert _equal(source, fresh)


@pytest.mark.parametrize(
    "content",
    [b"\xff" + os.urandom(64), b"hello, world\n", b"", b"PK\x03\x04" + os.urandom(64)],
    ids=["random", "text", "empty", "broken-zip"],
)
def test_garbage_is_refused_naming_the_path_and_the_kinds(tmp_path, content):
    path = tmp_path / "garbage.bin"
    path.write_bytes(content)
    with pytest.raises(ValueError) as caught:
        read_weights(path)
    message = str(caught.value)
    assert str(path) in message
    assert "clorch checkpoint" in message and "state_dict" in message and ".safetensors" in message


def test_json_that_is_not_a_checkpoint_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="JSON file but not a clorch checkpoint"):
        read_weights(path)


def test_bad_safetensors_file_is_refused(tmp_path):
    path = tmp_path / "w.safetensors"
    path.write_bytes(os.urandom(100))
    with pytest.raises(ValueError, match="not a readable safetensors file") as caught:
        read_weights(path)
    assert str(path) in str(caught.value)


def test_pickled_whole_model_is_refused_with_a_hint(tmp_path):
    path = tmp_path / "model.pt"
    torch.save(_Net(), path)
    with pytest.raises(ValueError, match=r"save model\.state_dict\(\) instead"):
        read_weights(path)


def test_missing_file_and_directory(tmp_path):
    missing = tmp_path / "nowhere.pt"
    with pytest.raises(WeightsFileNotFoundError, match="no weights file at .*nowhere.pt") as caught:
        read_weights(missing)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, FileNotFoundError)
    with pytest.raises(ValueError, match="is a directory"):
        read_weights(tmp_path)
    with pytest.raises(TypeError, match="path must be a str or os.PathLike, got int"):
        read_weights(3)


def test_tied_weights_are_saved_under_every_name(tmp_path):
    source = _random(_TiedLM(), 1)
    path = save_safetensors(source, tmp_path / "lm.safetensors")
    loaded = load_file(path)
    assert set(loaded) == {"embed.weight", "out.weight"}
    assert torch.equal(loaded["embed.weight"], source.embed.weight)
    assert torch.equal(loaded["out.weight"], source.embed.weight)
    fresh = _random(_TiedLM(), 2)
    load_weights(fresh, path)
    assert fresh.out.weight is fresh.embed.weight  # still tied
    assert torch.equal(fresh.embed.weight, source.embed.weight)


def test_failed_save_keeps_the_previous_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = save_safetensors(_random(_Net(), 1), tmp_path / "w.safetensors")
    before = path.read_bytes()

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("safetensors.torch.save_file", disk_full)
    with pytest.raises(OSError, match="No space"):
        save_safetensors(_random(_Net(), 2), path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["w.safetensors"]


# --- Hugging Face save_pretrained folders and tied weights -------------------------------------------
def _hf_folder(tmp_path, source: torch.nn.Module, shards: int = 1):
    """`source`'s weights as save_pretrained writes them: the tied `out.weight` left out, in one
    model.safetensors or in `shards` files listed by model.safetensors.index.json."""
    from safetensors.torch import save_file

    folder = tmp_path / "pretrained"
    folder.mkdir()
    state = {k: v.contiguous() for k, v in source.state_dict().items() if k != "out.weight"}
    if shards == 1:
        save_file(state, folder / "model.safetensors")
        return folder
    names, weight_map = sorted(state), {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: state[n] for n in names[i::shards]}
        save_file(part, folder / file)
        weight_map.update(dict.fromkeys(part, file))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


class _TiedNet(_TiedLM):
    """A tied language model with more than one tensor to shard."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(4)


@pytest.mark.parametrize("shards", [1, 2])
def test_a_save_pretrained_folder_loads_with_its_tied_weight_left_out(tmp_path, shards):
    source = _random(_TiedNet(), 1)
    folder = _hf_folder(tmp_path, source, shards)
    with torch.device("meta"):
        assert fit_errors(_TiedNet(), read_weights(folder)) == []
    fresh = _random(_TiedNet(), 2)
    load_weights(fresh, folder)  # strict: out.weight comes from embed.weight, as the model ties them
    assert _equal(fresh, source) and fresh.out.weight is fresh.embed.weight
    with open_weights(folder) as lazy:
        assert set(lazy) == {"embed.weight", "norm.weight", "norm.bias"}
        assert torch.equal(lazy["norm.bias"], source.norm.bias)


def test_a_folder_without_weights_or_with_a_bad_index_is_named(tmp_path):
    with pytest.raises(ValueError, match="without model weights: a Hugging Face save_pretrained folder holds model"):
        read_weights(tmp_path)
    folder = _hf_folder(tmp_path, _random(_TiedNet(), 1), shards=2)
    index = folder / "model.safetensors.index.json"
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ValueError, match="lists shard\\(s\\) missing from .*: model-00002-of-00002.safetensors"):
        read_weights(folder)
    index.write_text(json.dumps({"weight_map": {"norm.bias": "../elsewhere.safetensors"}}))
    with pytest.raises(ValueError, match="not file names beside it"):
        read_weights(folder)


def test_a_missing_key_the_file_could_hold_points_at_init_strict(tmp_path):
    source, fresh, path = _one_missing_one_extra(tmp_path)
    errors = fit_errors(fresh, read_weights(path), key="model.init_from")
    assert errors[0].endswith(
        "head.bias; model.init_strict=false (strict=False in Python) loads the file's keys "
        "and keeps the model's own values for these"
    )
    assert errors[1].endswith("extra.weight; model.init_strict=false (strict=False in Python) leaves them out")


def test_huggingface_save_pretrained_folders_load_whole_and_sharded(tmp_path):
    transformers = pytest.importorskip("transformers")

    config = transformers.GPT2Config(
        vocab_size=32, n_positions=16, n_layer=1, n_head=2, n_embd=16, bos_token_id=None, eos_token_id=None
    )
    torch.manual_seed(1)
    source = transformers.GPT2LMHeadModel(config)
    source.save_pretrained(tmp_path / "whole")
    source.save_pretrained(tmp_path / "sharded", max_shard_size="4KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    for folder in ("whole", "sharded"):
        assert "lm_head.weight" not in read_weights(tmp_path / folder)  # left out: tied to the embedding
        torch.manual_seed(2)
        fresh = transformers.GPT2LMHeadModel(config)
        load_weights(fresh, tmp_path / folder)
        assert _equal(fresh, source), folder
