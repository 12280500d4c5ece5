#!/usr/bin/env bash
# One device call: environment, the cuda test tier, then the benchmarks named in $STAGES.
# Everything goes to $OUT/all.log (the device tool brings back only a few files).
#   STAGES="env tests allreduce ddp_cpu" bash docs/gpu-runs/2026-12-01-h200-b/scripts/run.sh
set -uo pipefail
OUTDIR=${1:-${OUT:-/tmp/clorch-gpu}}
mkdir -p "$OUTDIR"
source scripts/gpu-setup.sh
STAGES=${STAGES:-env tests allreduce ddp_cpu}
run() { echo "=== $1 $(date -u +%T): ${*:2}"; local t=$SECONDS; timeout "${LIMIT:-400}" "${@:2}"; echo "=== $1 rc=$? ($((SECONDS - t)) s)"; }
{
echo "commit ${COMMIT:-unknown}"
for stage in $STAGES; do case $stage in
env)
  run env $PY - <<'PY'
import datetime, os, platform, torch
print("date", datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "nccl", ".".join(map(str, torch.cuda.nccl.version())), "cpus", os.cpu_count())
for i in range(torch.cuda.device_count()):
    print("gpu", i, torch.cuda.get_device_name(i))
PY
  nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv ;;
tests)
  run tests $PY -m pytest -q -m cuda -p no:cacheprovider tests ${PYTEST_ARGS:-} ;;
allreduce)  # the wrapper's own time with the live-group check, and end to end on one NCCL rank
  run allreduce clorch-bench allreduce --backend nccl --nproc 1 --sizes 4 4K 1M --rounds 9 ;;
ddp_cpu)    # clorch DDP vs torch DDP on gloo, 2 CPU ranks, on this host's CPUs
  LIMIT=200 run ddp_cpu clorch-bench ddp --device cpu --nproc 2 --rounds 15
  LIMIT=200 run ddp_cpu_t4 clorch-bench ddp --device cpu --nproc 2 --rounds 15 --threads 4 ;;
*) echo "unknown stage $stage" ;;
esac; done
} 2>&1 | tee "$OUTDIR/all.log"
