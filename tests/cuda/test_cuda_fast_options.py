"""GPU tier: the fused output layer and loss compiled (bf16), precision=fp8 trains and resumes on
one GPU with the plain model's checkpoint keys, and Liger-Kernel's patches give the same loss.

bf16 tolerance: the fused loss and the plain one read the same bf16 logits; their float32 sums
differ in order only, so the loss agrees to 1e-3 relative and the gradients to 2e-2.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from clorch.checkpoint.weights import weight_names
from clorch.models.gpt import GPT, GPTConfig
from clorch.nn.fused_loss import fuse_output_loss, linear_cross_entropy
from tests.clirunner import run_clorch_train

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]


def _fp8_capable() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def test_fused_loss_compiles_and_matches_the_plain_loss_in_bf16():
    torch.manual_seed(0)
    n, d, v = 4096, 256, 8192
    hidden = torch.randn(n, d, device="cuda", requires_grad=True)
    weight = (0.05 * torch.randn(v, d, device="cuda")).requires_grad_()
    target = torch.randint(0, v, (n,), device="cuda")
    fused = torch.compile(lambda h, w, t: linear_cross_entropy(h, w, t, chunk_size=1024), fullgraph=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = fused(hidden, weight, target)
        want = F.cross_entropy(F.linear(hidden, weight).float(), target)
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    grads = torch.autograd.grad(got, (hidden, weight))
    wants = torch.autograd.grad(want, (hidden, weight))
    for g, w in zip(grads, wants):
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-4)


def test_fused_gpt_step_holds_less_memory_than_the_plain_one():
    config = GPTConfig(vocab_size=50304, seq_len=256, n_layer=2, n_head=4, d_model=256)
    idx = torch.randint(0, 50304, (16, 256), device="cuda")
    peaks = {}
    for name in ("plain", "fused"):
        torch.manual_seed(0)
        model = GPT(config).cuda()
        if name == "fused":
            fuse_output_loss(model, 2048)
        compiled = torch.compile(model)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            if name == "fused":
                loss = compiled(idx, target=idx)
            else:
                loss = F.cross_entropy(compiled(idx).float().flatten(0, 1), idx.flatten())
        loss.backward()
        torch.cuda.synchronize()
        peaks[name] = torch.cuda.max_memory_allocated()
        del model, compiled, loss
    # 4096 tokens x 50304 logits: 0.4 GB in bf16, more as float32; the fused step never holds them
    assert peaks["fused"] < peaks["plain"] - 200 * 2**20, peaks


def _corpus(tmp_path: Path) -> None:
    random.seed(0)
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa"]
    (tmp_path / "corpus.txt").write_text(" ".join(random.choice(words) for _ in range(60000)))


def _train(tmp_path: Path, run: str, ckpt: str, *extra: str):
    args = ["data=text", "data.path=corpus.txt", "data.seq_len=128", "batch_size=16", "model=gpt"]
    args += ["model.d_model=256", "model.n_head=4", "model.n_layer=2", "compile=true", "launcher.nproc_per_node=1"]
    args += ["checkpoint=periodic", "checkpoint.every_n_steps=10", f"checkpoint.dir={tmp_path / ckpt}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = run_clorch_train([*args, *extra, f"hydra.run.dir={tmp_path / run}"], tmp_path, env=env, timeout=500)
    assert done.returncode == 0, done.stderr[-4000:]
    records = [json.loads(x) for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == "train"], [r for r in records if r["kind"] == "eval"], done


@pytest.mark.skipif(not _fp8_capable(), reason="float8 needs compute capability 8.9")
def test_fp8_trains_and_resumes_with_the_plain_models_checkpoint(tmp_path):
    pytest.importorskip("torchao.float8")
    _corpus(tmp_path)
    fp8 = ["precision=fp8", "precision.min_features=256", "log_every=5", "eval_every=10"]
    train, _, _ = _train(tmp_path, "first", "ckpt", *fp8, "max_steps=20")
    assert train[-1]["loss"] < train[0]["loss"] and all(r["loss"] == r["loss"] for r in train)
    ckpt = sorted((tmp_path / "ckpt").glob("*.ckpt"))
    assert ckpt, list((tmp_path / "ckpt").iterdir())
    resumed, evals, done = _train(tmp_path, "second", "ckpt", *fp8, "max_steps=30", "checkpoint.resume=latest")
    assert "resuming from" in done.stdout + done.stderr
    # a resumed run carries the first run's metrics over, then logs its own steps
    assert resumed[: len(train)] == train and [r["step"] for r in resumed[len(train) :]] == [25, 30]
    assert evals[-1]["step"] == 30
    plain = GPT(GPTConfig(vocab_size=256, seq_len=128, n_layer=2, n_head=4, d_model=256))
    assert set(plain.state_dict()) <= weight_names(str(ckpt[-1]))


def test_chunked_loss_trains_compiled_on_the_gpu_like_the_plain_loss(tmp_path):
    _corpus(tmp_path)
    common = ["max_steps=10", "log_every=5", "eval_every=10", "precision=bf16"]
    plain, plain_eval, _ = _train(tmp_path, "plain", "ckpt-plain", *common)
    fused, fused_eval, _ = _train(
        tmp_path, "fused", "ckpt-fused", *common, "loss=chunked_cross_entropy", "loss.chunk_size=512"
    )
    assert fused[-1]["loss"] == pytest.approx(plain[-1]["loss"], rel=2e-2)
    assert fused_eval[-1]["eval_loss"] == pytest.approx(plain_eval[-1]["eval_loss"], rel=2e-2)


def test_liger_patches_a_llama_and_keeps_its_loss_compiled_or_not():
    pytest.importorskip("liger_kernel")
    transformers = pytest.importorskip("transformers")
    from clorch.nn.liger import apply_liger

    config = transformers.LlamaConfig(
        vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4
    )
    idx = torch.randint(0, 1024, (4, 128), device="cuda")
    losses = {}
    for name in ("plain", "liger", "liger-compiled"):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).cuda()
        keys = list(model.state_dict())
        if name.startswith("liger"):
            apply_liger(model)
            assert list(model.state_dict()) == keys
        run = torch.compile(model) if name.endswith("compiled") else model
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = run(input_ids=idx, labels=idx).loss
        loss.backward()  # Liger's fused loss makes its gradients in forward, uncompiled
        assert model.lm_head.weight.grad is not None
        losses[name] = loss.float().item()
    assert losses["liger"] == pytest.approx(losses["plain"], rel=2e-2)
    assert losses["liger-compiled"] == pytest.approx(losses["plain"], rel=2e-2)
