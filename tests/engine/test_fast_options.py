"""loss=chunked_cross_entropy, precision=fp8 and model.liger through clorch-train on CPU:
the fused loss trains as the plain one does, and the options the CPU cannot run are config
errors before launch that say why."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from clorch.config.overrides import check_overrides
from clorch.plan.plan import resolve_errors
from tests.clirunner import run_clorch_train, run_clorch_train_batch

ROOT = Path(__file__).resolve().parents[2]
TINY_GPT = ["model=gpt", "model.n_layer=1", "model.d_model=32", "model.n_head=2"]


def _errors(*overrides: str) -> list[str]:
    return check_overrides(list(overrides), resolve_errors)


def _has(errors: list[str], *parts: str) -> bool:
    return any(all(p in e for p in parts) for e in errors)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.timeout(240)
def test_chunked_loss_trains_and_evaluates_as_the_plain_loss(tmp_path):
    """Two CPU ranks over gloo, fp32: every training loss, gradient norm and eval loss of the
    fused output layer matches the plain one (1e-5 relative; 3 chunks a micro-batch), under
    parallel=ddp and parallel=fsdp (the loss inside the sharded root's forward)."""
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]
    random.seed(0)
    (tmp_path / "corpus.txt").write_text(" ".join(random.choice(words) for _ in range(3000)))
    common = ["data=text", "data.path=corpus.txt", "data.seq_len=16", "batch_size=4", "max_steps=6", "eval_every=3"]
    common += ["precision=fp32", *TINY_GPT, "log_every=1"]
    runs = {}
    fused = ["loss=chunked_cross_entropy", "loss.chunk_size=24"]
    for name, extra in (("plain", []), ("fused", fused), ("fused-fsdp", [*fused, "parallel=fsdp"])):
        runs[name] = tmp_path / name
        done = run_clorch_train([*common, *extra, f"hydra.run.dir={runs[name]}"], tmp_path, env=_env(), timeout=200)
        assert done.returncode == 0, done.stderr[-3000:]
    plain = _records(runs["plain"])
    for name in ("fused", "fused-fsdp"):
        fused = _records(runs[name])
        assert [r["kind"] for r in plain] == [r["kind"] for r in fused] and len(plain) >= 4
        for a, b in zip(plain, fused):
            for key in ("loss", "grad_norm", "eval_loss"):
                if key in a:
                    assert b[key] == pytest.approx(a[key], rel=1e-5), (name, key, a, b)


@pytest.mark.parametrize(
    "overrides, parts",
    [
        (["precision=fp8"], ["precision=fp8 needs CUDA GPUs", "compute capability 8.9", "CPU ranks over gloo"]),
        (["precision=fp8", "precision.recipe=blockwise"], ["precision.recipe='blockwise'", "tensorwise, rowwise"]),
        (["precision=fp8", "precision.min_features=8"], ["precision.min_features must be >= 16"]),
        (["loss=chunked_cross_entropy"], ["loss=chunked_cross_entropy", "data=text or data=tokens", "data=synthetic"]),
        (["loss=chunked_cross_entropy", "data=arithmetic", "model=mlp"], ["needs a language model", "model=mlp"]),
        (["loss=chunked_cross_entropy", "loss.chunk_size=0"], ["loss.chunk_size must be >= 1 (tokens), got 0"]),
        (
            ["model._target_=torch.nn.Linear", "+model.liger=true", "loss=from_model"],
            ["model.liger=true needs CUDA GPUs", "CPU ranks over gloo"],
        ),
        (["model._target_=torch.nn.Linear", "+model.liger=true"], ["model.liger=true", "needs loss=from_model"]),
    ],
)
def test_config_errors_before_launch(overrides, parts):
    errors = _errors(*overrides)
    assert _has(errors, *parts), errors


def test_fp8_without_torchao_names_the_extra():
    """torchao is not in clorch's test install: the error names the extra that installs it."""
    try:
        import torchao  # noqa: F401
    except ImportError:
        assert _has(_errors("precision=fp8"), "precision=fp8 needs the torchao package", "clorch[fp8]")
    else:
        assert not _has(_errors("precision=fp8"), "torchao package")


@pytest.mark.timeout(120)
def test_the_command_line_refuses_fp8_on_cpu_with_exit_2(tmp_path):
    (done,) = run_clorch_train_batch([(["precision=fp8"], tmp_path)], env=_env(), timeout=100)
    assert done.returncode == 2, done.stderr
    assert "precision=fp8 needs CUDA GPUs" in done.stderr


def test_liger_on_an_unsupported_hugging_face_model_is_a_config_error(tmp_path, monkeypatch):
    """The architecture is read from the model built on the meta device (on a CUDA machine with
    liger-kernel the plan reports it; here the machine's own errors come first, so the check is
    called directly)."""
    pytest.importorskip("transformers")
    import numpy as np

    from clorch.config import compose
    from clorch.config.checks import checked
    from clorch.plan.machine import liger_errors

    np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint16).tofile(tmp_path / "train.bin")
    monkeypatch.setenv("CLORCH_TRUSTED_MODULES", "transformers")
    recipe = ROOT / "examples" / "hf_causal_lm" / "tiny_gpt2.yaml"
    data = [f"data.train_path={tmp_path / 'train.bin'}", "data.eval_path=null"]
    assert liger_errors(checked(compose([f"+recipe={recipe}", *data]))[0]) == []
    (error,) = liger_errors(checked(compose([f"+recipe={recipe}", *data, "+model.liger=true"]))[0])
    assert error.startswith("model.liger=true supports Hugging Face models of type llama, mistral")
    assert "a GPT2LMHeadModel (model_type 'gpt2')" in error
