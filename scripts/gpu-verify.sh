#!/usr/bin/env bash
# GPU verification in one go (run on the lent GPU machine by the `device` tool,
# or on any Linux box with CUDA and torch >= 2.11 preinstalled):
#   bash scripts/gpu-verify.sh [OUTDIR]
# Installs clorch (and the carried hydra/omegaconf wheels in .whl/, when present)
# into /tmp/site, records the environment, runs the `cuda` test tier, one recipe
# end to end and the GPU benchmarks, and writes everything under OUTDIR.
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
    print("gpu", i, torch.cuda.get_device_name(i))
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
*) echo "unknown stage $stage" ;;
esac; done
