#!/usr/bin/env bash
# Two-GPU NCCL validation and scaling in one go, on a machine with 2 GPUs
# (a machine with two H200s, or any Linux box with two CUDA GPUs and torch >= 2.11):
#   bash scripts/gpu-2gpu.sh [OUTDIR]
# Installs the carried hydra/omegaconf wheels in .whl/ (when present) into /tmp/site,
# records the environment, then runs on GPUs 0 and 1:
#   tests     the `cuda` test tier (world sizes 1..GPU count: every collective, the fp16
#             overflow skipped on both ranks, a failing worker taking the other down, the
#             torch DDP script ported by its imports within torch's own noise floor)
#   recipe    clorch-train +recipe=ddp_bf16 on devices [0,1], accumulation 2, final checkpoint
#   run_local clorch.run_local(devices=[0, 1]) with the same checks, from Python
#   torchrun  clorch-train +recipe=ddp_bf16 launcher=torchrun (torch's elastic agent, 2 GPUs)
#   nodes     clorch's launcher as two "nodes" of one GPU each (launcher.nnodes=2)
#   allreduce clorch-bench allreduce, 2 ranks, nccl, 4 KiB to 4 GiB
#   ddp       clorch-bench ddp --model gpt2-small --device cuda --nproc 2 (with --trace)
#   runner    clorch-bench runner, eager and --compile (one GPU)
#   runner_tuned clorch-bench runner --compile --compile-mode max-autotune-no-cudagraphs (one GPU)
#   runner_graphs clorch-bench runner --compile --compile-mode reduce-overhead (CUDA graphs, one GPU)
#   ddp1      clorch-bench ddp at world size 1 (the bucket path, with and without overlapped copies, vs the plain model)
#   checkpoint clorch-bench checkpoint on the host's CPUs and disk
#   ddp_cpu   clorch-bench ddp on 2 gloo ranks on the host's CPUs (MLP), 1 and 4 threads a rank
#   goals     the goals read back from the two benchmark tables
# Everything goes under OUTDIR (default $OUT, else /tmp/clorch-2gpu); stages.txt lists each
# stage's exit status. Estimated 6-8 minutes in all (the 1-GPU cuda tier took 2); STAGES="allreduce ddp goals"
# runs a subset. CPU_DRY_RUN=1 checks the plumbing without GPUs (gloo ranks, tiny sizes).
set -uo pipefail
OUTDIR=${1:-${OUT:-/tmp/clorch-2gpu}}
mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd)
source "$(dirname "$0")/gpu-setup.sh"
if [ "${CPU_DRY_RUN:-0}" = 1 ]; then
  DEV=cpu BACKEND=gloo MODEL=gpt-tiny DEVICES=null SIZES="1M 4M"
  RUNNER_ARGS="--device cpu --preset tiny --rounds 2 --steps 2 --warmup 1" CKPT_ARGS="--params-m 4 --rounds 2"
else
  DEV=cuda BACKEND=nccl MODEL=gpt2-small DEVICES="[0,1]" SIZES="4K 64K 256K 1M 4M 16M 64M 256M 1G 4G"
fi
export DEV DEVICES OUTDIR
STAGES=${STAGES:-env tests recipe run_local allreduce ddp goals}
: > "$OUTDIR/stages.txt"
run() {
  echo "=== $1: ${*:2}"; local t=$SECONDS; "${@:2}"; local rc=$?
  echo "=== $1 rc=$rc ($((SECONDS - t)) s)"; echo "$1 rc=$rc $((SECONDS - t))s" >> "$OUTDIR/stages.txt"; return 0
}

for stage in $STAGES; do case $stage in
env)
  run env $PY - <<'PY' 2>&1 | tee "$OUTDIR/env.txt"
import datetime, os, platform, torch
print("date", datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
print("nccl", ".".join(map(str, torch.cuda.nccl.version())))
for i in range(torch.cuda.device_count()):
    print("gpu", i, torch.cuda.get_device_name(i))
print("env", {k: os.environ[k] for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")})
PY
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv | tee -a "$OUTDIR/env.txt"
    nvidia-smi topo -m 2>&1 | tee -a "$OUTDIR/env.txt"
  fi ;;
tests)
  run tests timeout ${TESTS_TIMEOUT:-1800} $PY -m pytest -q -m cuda -p no:cacheprovider tests ${PYTEST_ARGS:-} 2>&1 | tee "$OUTDIR/tests.txt" ;;
recipe)
  # NCCL gradient reduction, bf16 autocast, accumulation 2 (no_sync), rank-zero final checkpoint.
  run recipe clorch-train +recipe=ddp_bf16 "launcher.devices=$DEVICES" accumulation=2 checkpoint=final \
    hydra.run.dir="$OUTDIR/recipe" ${RECIPE_ARGS:-} 2>&1 | tail -40 | tee "$OUTDIR/recipe.txt"
  ls -l "$OUTDIR/recipe/checkpoints" 2>&1 | tee -a "$OUTDIR/recipe.txt" ;;
run_local)
  run run_local $PY - <<'PY' 2>&1 | tee "$OUTDIR/run_local.txt"
import json, os, pathlib, sys
import clorch

out = pathlib.Path(os.environ["OUTDIR"]) / "run_local"
devices = [0, 1] if os.environ["DEV"] == "cuda" else None
ckpt = out / "ddp.ckpt"
result = clorch.run_local(devices=devices, recipe="ddp_bf16", epochs=4, sample_count=1024, batch_size=32,
                          accumulation=2, precision="bf16", checkpoint_path=str(ckpt), run_dir=str(out / "run"))
env = json.loads((out / "run" / "env.json").read_text())
checks = {"succeeded": result["status"]["state"] == "succeeded",
          "two ranks": len(result["logs"]) == 2,
          "backend": env["plan"]["backend"] == ("nccl" if devices else "gloo"),
          "checkpoint written by rank 0": ckpt.is_file()}
print("summary", json.dumps(result["summary"], default=str)[:2000])
print("plan", env["plan"])
for name, ok in checks.items():
    print(f"{'ok  ' if ok else 'FAIL'} {name}")
if not all(checks.values()):
    print(result["logs"][0]["stderr"][-3000:])
sys.exit(0 if all(checks.values()) else 1)
PY
  ;;
torchrun)
  # launcher=torchrun: torch's elastic agent starts one rank per GPU, NCCL, c10d rendezvous.
  run torchrun clorch-train +recipe=ddp_bf16 launcher=torchrun launcher.nproc_per_node=2 \
    launcher.rdzv_endpoint=127.0.0.1:29477 hydra.run.dir="$OUTDIR/torchrun" 2>&1 | grep -v '^W' | tail -20 \
    | tee "$OUTDIR/torchrun.txt"
  $PY -c "import json; d=json.load(open('$OUTDIR/torchrun/summary.json')); print('torchrun summary', d['status'], d['backend'], d['world_size'], d['steps'])" \
    2>&1 | tee -a "$OUTDIR/torchrun.txt" ;;
nodes)
  # clorch's own launcher as two "nodes" on one host (one GPU each): the nodes meet at
  # master_port before any rank starts, then NCCL across them; same weights as run_local's pair.
  for node in 1 0; do
    clorch-train +recipe=ddp_bf16 launcher.nnodes=2 launcher.node_rank=$node launcher.master_port=29611 \
      "launcher.devices=[$node]" launcher.rdzv_timeout=120 hydra.run.dir="$OUTDIR/nodes/n$node" \
      > "$OUTDIR/nodes_n$node.txt" 2>&1 &
  done
  run nodes wait
  tail -3 "$OUTDIR"/nodes_n*.txt | tee "$OUTDIR/nodes.txt"
  $PY -c "import json; d=json.load(open('$OUTDIR/nodes/n0/summary.json')); print('nodes summary', d['status'], d['backend'], d['world_size'], d['steps'], d['weights_sha256'])" \
    2>&1 | tee -a "$OUTDIR/nodes.txt" ;;
allreduce)
  run allreduce clorch-bench allreduce --sizes $SIZES --backend $BACKEND --nproc 2 2>&1 | tee "$OUTDIR/bench_allreduce.txt" ;;
runner)
  # One GPU: clorch's loop vs a plain PyTorch loop, eager and compiled (GPT-2 small, bf16).
  run runner clorch-bench runner ${RUNNER_ARGS:-} 2>&1 | tail -8 | tee "$OUTDIR/bench_runner.txt"
  run runner_compile clorch-bench runner --compile ${RUNNER_ARGS:-} 2>&1 | tail -8 \
    | tee "$OUTDIR/bench_runner_compile.txt" ;;
runner_tuned)
  # compile_mode=max-autotune-no-cudagraphs for both loops (minutes of autotuning first).
  run runner_tuned clorch-bench runner --compile --compile-mode max-autotune-no-cudagraphs ${RUNNER_ARGS:-} \
    2>&1 | tail -8 | tee "$OUTDIR/bench_runner_tuned.txt" ;;
runner_graphs)
  # compile_mode=reduce-overhead (or $GRAPHS_MODE) for both loops: the step replays CUDA graphs.
  run runner_graphs clorch-bench runner --compile --compile-mode ${GRAPHS_MODE:-reduce-overhead} ${RUNNER_ARGS:-} \
    2>&1 | tail -8 | tee "$OUTDIR/bench_runner_graphs.txt" ;;
ddp1)
  # World size 1: clorch's DDP (no reducer), with step_in_backward (bucket path, nothing to send),
  # torch's DDP (its bucket path) and the bare model.
  run ddp1 clorch-bench ddp --model $MODEL --device $DEV --nproc 1 2>&1 | tee "$OUTDIR/bench_ddp1.txt" ;;
checkpoint)
  run checkpoint clorch-bench checkpoint ${CKPT_ARGS:---rounds 6} 2>&1 | tee "$OUTDIR/bench_checkpoint.txt" ;;
ddp)
  # --trace: one torch.profiler step per DDP candidate and rank, with its exposed communication.
  run ddp clorch-bench ddp --model $MODEL --device $DEV --nproc 2 --trace "$OUTDIR/trace" ${DDP_ARGS:-} 2>&1 \
    | tee "$OUTDIR/bench_ddp.txt" ;;
ddp_cpu)
  run ddp_cpu clorch-bench ddp --device cpu --nproc 2 --rounds 15 2>&1 | tee "$OUTDIR/bench_ddp_cpu.txt"
  run ddp_cpu_t4 clorch-bench ddp --device cpu --nproc 2 --rounds 15 --threads 4 2>&1 \
    | tee "$OUTDIR/bench_ddp_cpu_t4.txt" ;;
goals)
  run goals $PY - <<'PY' 2>&1 | tee "$OUTDIR/goals.txt"
# The two-GPU goals, read back from the benchmark tables (Markdown rows: | a | b | ... |).
import os, pathlib, re
out = pathlib.Path(os.environ["OUTDIR"])
def rows(name):
    text = (out / name).read_text() if (out / name).is_file() else ""
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|") and not line.startswith("|-")][1:]
ar = [r for r in rows("bench_allreduce.txt") if not r[0].endswith(" B") and r[0] not in ("4 KiB", "16 KiB")]
if ar:
    worst = min(ar, key=lambda r: float(r[6]))
    best = max(ar, key=lambda r: float(r[4]))
    print(f"allreduce ratio raw/clorch >= 0.97 from 64 KiB: min {float(worst[6]):.4f} at {worst[0]}")
    print(f"allreduce peak clorch busbw {best[4]} GB/s at {best[0]} = {float(best[4]) / 370:.3f} of the "
          f"~370 GB/s NVLink 4 ring ceiling without NVLS")
text = (out / "bench_ddp.txt").read_text() if (out / "bench_ddp.txt").is_file() else ""
for label, pattern, goal in (
        ("clorch DDP / torch DDP step time", r"clorch DDP / torch DDP step time: ([\d.]+)", "<= 1.00"),
        ("clorch DDP / torch DDP best", r"clorch DDP / torch DDP best .*?step time: ([\d.]+)", "<= 0.97"),
        ("clorch DDP step_in_backward / torch DDP best",
         r"clorch DDP step_in_backward / torch DDP best step time: ([\d.]+)", "<= 0.97"),
        ("scaling efficiency, clorch DDP", r"scaling efficiency .*?: clorch DDP ([\d.]+)", ">= 0.97"),
        ("scaling efficiency, clorch DDP step_in_backward",
         r"scaling efficiency .*?clorch DDP step_in_backward ([\d.]+)", ">= 0.97"),
        ("scaling efficiency, clorch DDP overlapped copies",
         r"scaling efficiency .*?clorch DDP overlapped copies ([\d.]+)", ">= 0.97"),
        ("scaling efficiency, clorch DDP step_in_backward overlapped copies",
         r"scaling efficiency .*?clorch DDP step_in_backward overlapped copies ([\d.]+)", ">= 0.97")):
    m = re.search(pattern, text)
    print(f"ddp {label}: {m.group(1) if m else 'missing'} (goal {goal})")
PY
  ;;
*) echo "unknown stage $stage" ;;
esac; done
cat "$OUTDIR/stages.txt"
