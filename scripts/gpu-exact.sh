#!/usr/bin/env bash
# exact=true on one GPU: the same bits twice (and on 1 rank with accumulation 2 against 2 micro-batches
# run as one rank's accumulation 2 again), then what it costs against the default on GPT-2 small, compiled.
#   bash scripts/gpu-exact.sh            (results under $OUT when set, else /tmp/gpu-exact)
set -uo pipefail
source scripts/gpu-setup.sh
OUT=${OUT:-/tmp/gpu-exact}; mkdir -p $OUT
python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())' | tee $OUT/env.txt
WORK=$(mktemp -d)
JOB="backend=nccl precision=bf16 model=gpt data=arithmetic model.n_layer=2 model.d_model=64 model.n_head=4 model.dropout=0.1
 optim.grad_clip=0.5 data.sample_count=512 batch_size=8 max_steps=20 log_every=5 launcher.nproc_per_node=1 preflight=false
 logger.progress=off exact=true"
for name in a b; do
  clorch-train $JOB accumulation=2 hydra.run.dir=$WORK/$name > $OUT/exact_$name.log 2>&1; echo "exact run $name: exit $?"
done
for name in a b; do python3 -c "import json,sys; print('$name', json.load(open('$WORK/$name/summary.json'))['weights_sha256'])"; done | tee $OUT/digests.txt
clorch-bench exact --device cuda --nproc 1 --preset gpt2-small --compile --batch-size 8 --rounds 3 --steps 60 2>&1 | tee $OUT/bench_exact.txt
