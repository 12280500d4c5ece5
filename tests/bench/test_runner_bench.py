"""`clorch-bench runner`: argument errors, and tiny smoke runs of both loops on gloo ranks."""

from __future__ import annotations

import pytest

from clorch.bench import runner


def test_every_bad_argument_is_reported_at_once(capsys):
    with pytest.raises(SystemExit) as exc:
        runner.main(["--device", "cpu", "--batch-size", "0", "--rounds", "0", "--peak-tflops", "-1", "--nproc", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--batch-size must be >= 1, got 0" in err and "--rounds must be >= 1, got 0" in err
    assert "--peak-tflops must be > 0, got -1.0" in err and "--nproc must be >= 1, got 0" in err


@pytest.mark.timeout(150)
def test_tiny_run_on_cpu_reports_both_loops(capsys):
    code = runner.main(
        [
            "--device",
            "cpu",
            "--preset",
            "tiny",
            "--batch-size",
            "2",
            "--rounds",
            "2",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--log-every",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert " plain | " in out and " clorch | " in out
    ratio = float(out.split("ratio clorch/plain tokens/s:")[1].split()[0])
    assert ratio > 0
    assert "GPU clock" not in out and "GPU during" not in out  # nothing to sample on CPU


@pytest.mark.timeout(150)
def test_the_dataset_path_runs_both_loops_through_a_dataloader_on_two_ranks(capsys):
    code = runner.main(
        [
            "--device",
            "cpu",
            "--preset",
            "tiny",
            "--batch-size",
            "2",
            "--rounds",
            "2",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--data",
            "dataset",
            "--num-workers",
            "1",
            "--nproc",
            "2",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "data=dataset (1 workers), cpu x 2;" in out and " clorch | " in out
    assert float(out.split("ratio clorch/plain tokens/s:")[1].split()[0]) > 0


def test_variant_arguments_are_checked_with_the_rest(capsys):
    with pytest.raises(SystemExit) as exc:
        runner.main(["--device", "cpu", "--variants", "fused,fp4", "--chunk-size", "0", "--preset", "tiny"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--variants 'fp4' is not one of fused, fp8, fp8-fused for --preset tiny" in err
    assert "--chunk-size must be >= 1, got 0" in err
    with pytest.raises(SystemExit):
        runner.main(["--device", "cpu", "--variants", "fp8", "--preset", "tiny"])
    assert "--variants fp8 and liger need --device cuda" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        runner.main(["--device", "cpu", "--preset", "llama-tiny"])
    assert "--preset llama-tiny runs --variants hf,liger" in capsys.readouterr().err


TINY_RUN = ["--device", "cpu", "--batch-size", "2", "--rounds", "2", "--steps", "2", "--warmup", "1"]


@pytest.mark.timeout(150)
def test_the_fused_variant_runs_beside_both_loops_and_learns_the_same(capsys):
    fused = ["--variants", "fused", "--chunk-size", "40", "--tokens", "markov"]
    code = runner.main([*TINY_RUN, "--preset", "tiny", *fused])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = {line.split("|")[1].strip(): line.split("|") for line in out.splitlines() if line.startswith("|")}
    assert {"plain", "clorch", "clorch+fused"} <= set(rows)
    # the same seeded model, data and steps: the fused loss trains the baseline's weights
    assert float(rows["clorch+fused"][5]) == pytest.approx(float(rows["clorch"][5]), rel=1e-3)
    assert float(out.split("ratio clorch+fused/clorch tokens/s:")[1].split()[0]) > 0
    # on the Markov chain each loop's held-out loss is read after each of its blocks (TINY_RUN: 2 of 2 steps)
    curve = out.split("held-out loss of clorch+fused after steps 3, 5: ")[1].split(" (lowest")[0]
    assert len(curve.split(", ")) == 2 and "held-out loss of plain" in out


@pytest.mark.timeout(150)
def test_a_hugging_face_llama_runs_as_a_variant(capsys, monkeypatch):
    pytest.importorskip("transformers")
    from clorch.bench import runner_variants

    monkeypatch.setitem(runner.PRESETS, "llama-tiny", dict(vocab_size=256, seq_len=32))
    small = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    monkeypatch.setattr(runner_variants, "LLAMA_TINY", small)
    code = runner.main([*TINY_RUN, "--preset", "llama-tiny", "--variants", "hf"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert " clorch+hf | " in out and " plain | " not in out and "ratio clorch/plain" not in out
