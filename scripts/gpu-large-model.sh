#!/usr/bin/env bash
# One GPU: a built-in GPT too large for one rank under parallel=ddp.
#   (a) parallel=ddp: the plan refuses it before launch and names parallel=fsdp;
#   (b) parallel=fsdp parallel.cpu_offload=true: trains max_steps=3, or is refused before launch
#       (the host cannot hold the offloaded state): the script records which.
# It prints the parameter count, the plan's per-rank estimate (clorch.plan.memory), and for
# each run its exit status, the peak GPU memory (nvidia-smi, sampled every second), the peak
# host RSS of the run's processes and the end of its console output.
#
# Sizes (PRESET, each overridable: N_LAYER D_MODEL N_HEAD BATCH SAMPLES):
#   refused (default): 52 x 4096, ~10.5B parameters: 16 B each (fp32 weights, gradients, AdamW's
#       two moments) is 156 GiB, more than an H200's memory under ddp; offloaded, more than a
#       128 GiB host holds too, so (b) is refused before launch on that machine.
#   offload: 36 x 4096, ~7.2B parameters (108 GiB of state) and a batch of 800 arithmetic
#       samples whose activations (~42 GiB) push ddp past the GPU; offloaded, the state fits a
#       host with >= ~110 GiB available and the GPU keeps the activations, so (b) may train.
#   tiny: 2 x 64, for checking this script's logic on a machine without a GPU.
# Run from the repository root; logs go to $OUT (or ./gpu-out). PYTHON picks the interpreter.
set -u
source scripts/gpu-setup.sh
OUT=${OUT:-gpu-out}; mkdir -p $OUT; OUT=$(cd $OUT && pwd)
case ${PRESET:-refused} in
  refused) L=52 D=4096 H=32 B=1 S=2048 ;;
  offload) L=36 D=4096 H=32 B=800 S=4096 ;;
  tiny) L=2 D=64 H=2 B=4 S=2048 ;;
  *) echo "PRESET must be refused, offload or tiny, got ${PRESET}" >&2; exit 2 ;;
esac
L=${N_LAYER:-$L} D=${D_MODEL:-$D} H=${N_HEAD:-$H} B=${BATCH:-$B} S=${SAMPLES:-$S}
ARGS=(model=gpt data=arithmetic precision=bf16 model.n_layer=$L model.d_model=$D model.n_head=$H
      batch_size=$B data.sample_count=$S max_steps=3 launcher.nproc_per_node=1 preflight=false)
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
  grep -E "MemTotal|MemAvailable" /proc/meminfo
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } > $OUT/large-versions.txt 2>&1
cat $OUT/large-versions.txt

# The plan's figures, on the meta device (no memory allocated), for ddp and for fsdp with offload.
$PY - "${ARGS[@]}" <<'EOF' | tee $OUT/large-estimate.txt
import sys
import torch
from clorch.config import compose
from clorch.config.checks import checked_partial
from clorch.plan import checks
from clorch.plan.data import model_sizes_of
from clorch.plan.memory import config_memory, human_bytes
from clorch.plan.model import build_model_for

cfg, errors = checked_partial(compose(sys.argv[1:]))
assert not errors, errors
sizes = model_sizes_of(cfg)
with torch.device("meta"):
    model = build_model_for(cfg, sizes)
gpu = checks._gpu_memory(cfg.launcher, 1)
cpu = gpu is None
print(f"parameters: {sum(p.numel() for p in model.parameters()):,}")
print(f"GPU total: {'-' if gpu is None else human_bytes(gpu)}; host available: {human_bytes(checks._available_memory() or 0)}")
for name, sharded, offload in (("ddp", False, False), ("fsdp cpu_offload", True, True)):
    m = config_memory(cfg, model, 1, sharded=sharded, cpu_offload=offload, cpu_ranks=cpu)
    print(f"estimate {name}: device {human_bytes(m.device)}, host {human_bytes(m.host)} per rank ({m.describe()})")
EOF

tree_rss_kib() {  # resident KiB of a process and all its descendants
  local total=0 pid child
  for pid in "$@"; do
    total=$((total + $(awk '/^VmRSS/ {print $2}' /proc/$pid/status 2>/dev/null || echo 0)))
    for child in $(cat /proc/$pid/task/*/children 2>/dev/null); do
      total=$((total + $(tree_rss_kib $child)))
    done
  done
  echo $total
}

run() {  # run NAME OVERRIDES...: clorch-train with sampling; prints its record
  local name=$1; shift
  local log=$OUT/large-$name.log samples=$OUT/large-$name.samples
  : > $samples
  (cd $WORK && exec clorch-train "${ARGS[@]}" "$@" hydra.run.dir=$WORK/$name) > $log 2>&1 &
  local pid=$!
  while kill -0 $pid 2>/dev/null; do
    gpu=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | sort -n | tail -1)
    echo "${gpu:-0} $(tree_rss_kib $pid)" >> $samples
    sleep 1
  done
  wait $pid; local rc=$?
  local peak_gpu peak_rss
  peak_gpu=$(awk 'BEGIN {m = 0} $1 > m {m = $1} END {print m}' $samples)
  peak_rss=$(awk 'BEGIN {m = 0} $2 > m {m = $2} END {printf "%.2f", m / 1048576}' $samples)
  if [ $rc = 2 ] && grep -q "parameters need about" $log; then
    what="refused before launch"
  elif [ $rc = 0 ]; then
    what="trained: $(grep -o 'succeeded, [0-9]* steps' $log)"
  else
    what="failed after launch"
  fi
  {
    echo "== parallel=$name: rc=$rc, $what"
    echo "peak GPU memory used (nvidia-smi): ${peak_gpu} MiB; peak host RSS of the run: ${peak_rss} GiB"
    grep -E "parameters need about|Error" $log | head -5 || true
    [ $rc = 2 ] || tail -n 3 $log
  } | tee -a $OUT/large-summary.txt
}

WORK=$(mktemp -d /tmp/clorch-large.XXXXXX)
: > $OUT/large-summary.txt
run ddp parallel=ddp
if grep -q "under parallel=ddp.*parallel=fsdp" $OUT/large-ddp.log; then
  echo "(a) ddp refused before launch, naming parallel=fsdp" | tee -a $OUT/large-summary.txt
else
  echo "(a) ddp NOT refused with a parallel=fsdp hint: see $OUT/large-ddp.log" | tee -a $OUT/large-summary.txt
fi
run fsdp parallel=fsdp parallel.cpu_offload=true
rm -rf $WORK
