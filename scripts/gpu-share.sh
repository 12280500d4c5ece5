#!/usr/bin/env bash
# Several small trials on one GPU (hydra.sweeper.trials_per_gpu): the aggregate tokens/s of 4 trials
# of an 11M-parameter GPT one at a time, then 4 at once on the same GPU, then auto's choice.
#   bash scripts/gpu-share.sh            (results under $OUT when set, else /tmp/gpu-share)
set -uo pipefail
source scripts/gpu-setup.sh
OUT=${OUT:-/tmp/gpu-share}; mkdir -p $OUT
W=$(mktemp -d)
C="+recipe=gpt_bf16 backend=nccl launcher.nproc_per_node=1 model.n_layer=6 model.d_model=384 model.n_head=6
 max_steps=${STEPS:-400} eval_every=0 checkpoint=none logger.progress=off seed=1,2,3,4"
sweep() { local name=$1; shift; local s=$(date +%s.%N)
  clorch-train -m $C "$@" hydra.sweep.dir=$W/$name > $OUT/share_$name.log 2>&1 || echo "$name failed"
  echo "$name $(echo "$(date +%s.%N) - $s" | bc)" >> $W/walls.txt; }
sweep one hydra.sweeper.n_jobs=1
sweep four hydra.sweeper.n_jobs=4 hydra.sweeper.trials_per_gpu=4
sweep auto hydra.sweeper.n_jobs=8 hydra.sweeper.trials_per_gpu=auto
python3 - "$W" <<'PY' | tee $OUT/share.txt
import json, pathlib, sys
w = pathlib.Path(sys.argv[1]); walls = dict(l.split() for l in (w / "walls.txt").read_text().splitlines())
rate = {}
for name, wall in walls.items():
    runs = [json.loads(p.read_text()) for p in sorted((w / name).glob("[0-9]*/summary.json"))]
    tokens = sum((r.get("tokens_per_s") or 0) * (r.get("train_time_s") or 0) for r in runs)
    rate[name] = tokens / float(wall)
    print(f"{name}: {len(runs)} trials {[r['status'] for r in runs]}, sweep wall {float(wall):.1f} s, "
          f"{tokens:,.0f} tokens, aggregate {rate[name]:,.0f} tokens/s; per trial {[round(r.get('tokens_per_s') or 0) for r in runs]}")
for name in ("four", "auto"):
    if name in rate and rate.get("one"): print(f"{name} / one: {rate[name] / rate['one']:.2f}x")
PY
grep -h "trials_per_gpu=auto" $OUT/share_auto.log | head -2
