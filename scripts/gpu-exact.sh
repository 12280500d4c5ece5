#!/usr/bin/env bash
# exact=true on one GPU: ddp twice (the same bits run to run), ddp against fsdp in fp32, bf16 and
# bf16 compiled (the same bits promised eager; compiled is reported), then what exact=true costs
# against the default on GPT-2 small, compiled (clorch-bench exact).
#   bash scripts/gpu-exact.sh            (results under $OUT when set, else /tmp/gpu-exact)
set -uo pipefail
source scripts/gpu-setup.sh
OUT=${OUT:-/tmp/gpu-exact}; mkdir -p $OUT
python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())' | tee $OUT/env.txt
W=$(mktemp -d)
J="backend=nccl model=gpt data=arithmetic model.n_layer=2 model.d_model=64 model.n_head=4 model.dropout=0.1
 optim.grad_clip=0.5 data.sample_count=512 batch_size=8 max_steps=10 eval_every=0 launcher.nproc_per_node=1
 preflight=false logger.progress=off exact=true accumulation=2"
F="parallel=fsdp parallel.param_dtype=fp32"
run() { local name=$1; shift; clorch-train $J "$@" hydra.run.dir=$W/$name > $OUT/$name.log 2>&1 || echo "$name failed"; }
digest() { python3 -c "import json; print(json.load(open('$W/$1/summary.json'))['weights_sha256'])" 2>/dev/null || echo none; }
run ddp_fp32 precision=fp32; run ddp_fp32_again precision=fp32; run fsdp_fp32 precision=fp32 $F
run ddp_bf16 precision=bf16; run fsdp_bf16 precision=bf16 $F
run ddp_bf16_compiled precision=bf16 compile=true; run fsdp_bf16_compiled precision=bf16 compile=true $F
for pair in "ddp_fp32 ddp_fp32_again" "ddp_fp32 fsdp_fp32" "ddp_bf16 fsdp_bf16" "ddp_bf16_compiled fsdp_bf16_compiled"; do
  set -- $pair; a=$(digest $1); b=$(digest $2)
  echo "$1 vs $2: $([ "$a" = "$b" ] && [ "$a" != none ] && echo SAME || echo DIFFERENT) ($a / $b)"
done | tee $OUT/digests.txt
clorch-bench exact --device cuda --nproc 1 --preset gpt2-small --compile --batch-size 8 --rounds 2 --steps 40 2>&1 | tee $OUT/bench_exact.txt
