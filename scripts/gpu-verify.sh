#!/usr/bin/env bash
# GPU verification in one go (run on the lent GPU machine by the `device` tool,
# or on any Linux box with CUDA and torch >= 2.11 preinstalled):
#   bash scripts/gpu-verify.sh [OUTDIR]
# Installs clorch (and the carried hydra/omegaconf wheels in .whl/, when present)
# into /tmp/site, records the environment, runs the `cuda` test tier, one recipe
# end to end and the GPU benchmarks, and writes everything under OUTDIR.
# STAGES="fast fused fp8 liger" runs the fused loss, float8 and Liger measurements (each fits one call);
# fp8 and liger need torchao and liger-kernel wheels in .whl/ (docs/performance.md says which).
set -uo pipefail
OUTDIR=${1:-${OUT:-/tmp/clorch-gpu}}
mkdir -p "$OUTDIR"
source "$(dirname "$0")/gpu-setup.sh"
STAGES=${STAGES:-env tests recipe bench}
run() { echo "=== $1: ${*:2}"; local t=$SECONDS; "${@:2}"; local rc=$?; echo "=== $1 rc=$rc ($((SECONDS - t)) s)"; return 0; }

for stage in $STAGES; do case $stage in
env)
  run env $PY - <<'PY' | tee "$OUTDIR/env.txt"
import datetime, platform, torch
print("date", datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
print("nccl", ".".join(map(str, torch.cuda.nccl.version())))
for i in range(torch.cuda.device_count()):
    print("gpu", i, torch.cuda.get_device_name(i), "capability", torch.cuda.get_device_capability(i))
import importlib.metadata as md
for name in ("torchao", "liger-kernel", "transformers", "triton"):  # the fast stage's extras
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "not installed")
PY
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$OUTDIR/env.txt" ;;
tests)
  run tests $PY -m pytest -q -m cuda -p no:cacheprovider tests ${PYTEST_ARGS:-} 2>&1 | tee "$OUTDIR/tests.txt" ;;
recipe)
  (cd /tmp && run recipe clorch-train +recipe=gpt_bf16 ${RECIPE_ARGS:-}) 2>&1 | tail -40 | tee "$OUTDIR/recipe.txt" ;;
bench)
  run runner clorch-bench runner 2>&1 | tee "$OUTDIR/bench_runner.txt"
  run scaler clorch-bench scaler 2>&1 | tee "$OUTDIR/bench_scaler.txt"
  run runner-compile clorch-bench runner --compile 2>&1 | tee "$OUTDIR/bench_runner_compile.txt" ;;
examples)
  # Each example as shipped, on the GPU: one rank, NCCL, bf16 (the command line beats the recipe).
  GPU_ARGS="backend=auto precision=bf16 launcher.nproc_per_node=1"
  WORK=$(mktemp -d /tmp/clorch-examples.XXXXXX) && cp -r examples/. "$WORK"/
  (cd "$WORK/nanogpt" && $PY prepare.py && CLORCH_TRUSTED_MODULES=nanogpt run nanogpt clorch-train +recipe=./bytes.yaml $GPU_ARGS) 2>&1 | tail -15 | tee "$OUTDIR/example_nanogpt.txt"
  (cd "$WORK/hf_causal_lm" && $PY ../nanogpt/prepare.py && CLORCH_TRUSTED_MODULES=transformers run hf clorch-train +recipe=./tiny_gpt2.yaml $GPU_ARGS) 2>&1 | tail -15 | tee "$OUTDIR/example_hf.txt"
  (cd "$WORK/resnet" && CLORCH_TRUSTED_MODULES=resnet_example run resnet clorch-train +recipe=./stripes.yaml $GPU_ARGS) 2>&1 | tail -15 | tee "$OUTDIR/example_resnet.txt" ;;
fsdp)
  run fsdp-compiled clorch-bench fsdp --model gpt2-small --device cuda --precision bf16 --compile --nproc 1 2>&1 | tee "$OUTDIR/bench_fsdp_compiled.txt"
  run fsdp-eager clorch-bench fsdp --model gpt2-small --device cuda --precision bf16 --nproc 1 2>&1 | tee "$OUTDIR/bench_fsdp_eager.txt" ;;
sharded)
  # +recipe=gpt_bf16 under parallel=ddp and parallel=fsdp (one GPU: world size 1), then fsdp with fp16.
  for parallel in ddp fsdp; do
    (cd /tmp && run "gpt_bf16-$parallel" clorch-train +recipe=gpt_bf16 parallel=$parallel logger.progress=lines) 2>&1 | grep -E "^step .*eval|clorch-train:|===" | tail -6
  done 2>&1 | tee "$OUTDIR/gpt_bf16_ddp_fsdp.txt"
  (cd /tmp && run gpt_fp16-fsdp clorch-train +recipe=gpt_bf16 parallel=fsdp precision=fp16 max_steps=1024 logger.progress=lines) 2>&1 | grep -E "^step .*eval|clorch-train:|===" | tail -6 | tee "$OUTDIR/gpt_fp16_fsdp.txt" ;;
large)
  for preset in refused offload; do OUT="$OUTDIR/large-$preset" PRESET=$preset run "large-$preset" bash scripts/gpu-large-model.sh; done 2>&1 | tail -60 | tee "$OUTDIR/large.txt" ;;
fused)
  # GPT-2 small, bf16, compiled, 16 x 1024: the plain loop, clorch and clorch with loss=chunked_cross_entropy
  run fused clorch-bench runner --compile --variants fused ${FUSED_ARGS:-} 2>&1 | tee "$OUTDIR/bench_fused.txt"
  # what any fused output layer and loss could save at most: the same model without an output layer
  run fused-bound $PY scripts/probe_output_layer.py 2>&1 | tee "$OUTDIR/probe_output_layer.txt" ;;
fp8)
  # needs torchao (carried in .whl/). A GPT of about 1B parameters in 8 layers of width 3072, bf16 against
  # precision=fp8, compiled, batch 32 x 1024, 300 steps on the Markov chain (its "loss after" column:
  # held-out, 0.02 apart at most); then GPT-2 small under fp8 with the default layer choice (min 1024
  # features: no layer of GPT-2 small converts) and with every inner layer converted.
  run fp8-1b clorch-bench runner --compile --preset gpt-1b-wide --batch-size 32 --no-plain --variants fp8 --tokens markov \
    --warmup 60 --steps 40 --rounds 6 ${FP8_ARGS:-} 2>&1 | tee "$OUTDIR/bench_fp8_1b.txt"
  run fp8-small clorch-bench runner --compile --no-plain --variants fp8,fp8-fused 2>&1 | tee "$OUTDIR/bench_fp8_small.txt"
  run fp8-small-all clorch-bench runner --compile --no-plain --variants fp8 --fp8-min-features 16 2>&1 | tee "$OUTDIR/bench_fp8_small_all.txt" ;;
liger)
  # needs liger-kernel (carried in .whl/) and transformers: a small Llama through Hugging Face, its own loss,
  # without and with Liger-Kernel's patches
  run liger clorch-bench runner --compile --preset llama-tiny --batch-size 8 --variants hf,liger 2>&1 | tee "$OUTDIR/bench_liger.txt"
  run liger-eager clorch-bench runner --preset llama-tiny --batch-size 8 --variants hf,liger 2>&1 | tee "$OUTDIR/bench_liger_eager.txt" ;;
trialcost)
  # a sweep trial's fixed cost: clorch-train against a plain script, 200 compiled GPT-2 small steps, cold then warm
  run trialcost $PY scripts/trial_cost.py --steps 200 --runs 2 --out "$OUTDIR" 2>&1 | tee "$OUTDIR/trial_cost.txt" ;;
fast)
  # the cuda tests of the fused loss, fp8 and Liger alone (the tests stage runs them with the rest)
  run fast-tests $PY -m pytest -q -m cuda -p no:cacheprovider tests/cuda/test_cuda_fast_options.py 2>&1 | tee "$OUTDIR/tests_fast.txt" ;;
*) echo "unknown stage $stage" ;;
esac; done
