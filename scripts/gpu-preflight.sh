#!/usr/bin/env bash
# One H200 session: environment, the `cuda` test tier, and `preflight=only` timed end to end
# (three runs, the command's wall time each), all written under OUTDIR.
#   bash scripts/gpu-preflight.sh [OUTDIR]      (SKIP_TESTS=1: the timings alone)
set -uo pipefail
OUTDIR=${1:-${OUT:-/tmp/clorch-gpu}}
mkdir -p "$OUTDIR"
STAGES="env" bash "$(dirname "$0")/gpu-verify.sh" "$OUTDIR"
source "$(dirname "$0")/gpu-setup.sh"
cd /tmp
for i in 1 2 3; do
  t0=$EPOCHREALTIME
  clorch-train +recipe=gpt_bf16 preflight=only hydra.run.dir=/tmp/pf$i > "$OUTDIR/preflight_$i.txt" 2>&1
  rc=$?
  echo "preflight run $i rc=$rc wall_s=$(awk "BEGIN{print $EPOCHREALTIME - $t0}")" | tee -a "$OUTDIR/preflight_times.txt"
done
cp /tmp/pf1/preflight.json "$OUTDIR/" 2>/dev/null
cd - >/dev/null
[ "${SKIP_TESTS:-0}" = 1 ] || STAGES="tests" bash "$(dirname "$0")/gpu-verify.sh" "$OUTDIR"
# data=tokens on the GPU: a GPT-2 small shape over a generated nanoGPT-style token file.
cd /tmp && python3 -c "
import numpy as np
rng = np.random.default_rng(0)
np.tile(rng.integers(0, 50257, 4096, dtype=np.uint16), 2048).tofile('/tmp/train.bin')
rng.integers(0, 50257, 1 << 20, dtype=np.uint16).tofile('/tmp/val.bin')
"
t0=$EPOCHREALTIME
clorch-train data=tokens model=gpt data.train_path=/tmp/train.bin data.eval_path=/tmp/val.bin \
  data.seq_len=1024 data.vocab_size=50304 data.sample_count=8192 model.n_layer=12 model.d_model=768 \
  model.n_head=12 batch_size=16 max_steps=60 log_every=20 compile=true hydra.run.dir=/tmp/tok \
  > "$OUTDIR/tokens_gpt2.txt" 2>&1
echo "tokens run rc=$? wall_s=$(awk "BEGIN{print $EPOCHREALTIME - $t0}")" | tee -a "$OUTDIR/tokens_gpt2.txt"
cp /tmp/tok/summary.json "$OUTDIR/tokens_summary.json" 2>/dev/null
cd - >/dev/null
