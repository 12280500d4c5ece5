#!/usr/bin/env bash
# One H200 session: environment, the `cuda` test tier, and `preflight=only` timed end to end
# (three runs, the command's wall time each), all written under OUTDIR.
#   bash scripts/gpu-preflight.sh [OUTDIR]
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
STAGES="tests" bash "$(dirname "$0")/gpu-verify.sh" "$OUTDIR"
