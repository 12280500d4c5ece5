#!/usr/bin/env bash
# One H200: your own dataset through clorch-train on CUDA, and `clorch-bench runner --data dataset`
# (GPT-2 small, bf16) against a plain DataLoader loop, with 0 and 2 workers; then the tensor path.
# Run from the repository root on the GPU machine; logs go to $OUT (or ./gpu-out).
set -u
source scripts/gpu-setup.sh
OUT=${OUT:-gpu-out}; mkdir -p $OUT
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"; } > $OUT/versions.txt 2>&1
cd /tmp && clorch-train +recipe=ddp_bf16 data._target_=clorch.data.datasets.Blobs loss=cross_entropy \
   data.sample_count=8192 data.num_workers=2 epochs=2 > $OUT/user-data-train.log 2>&1; echo "train rc=$?" >> $OUT/user-data-train.log
cd - >/dev/null
for w in 0 2; do
  clorch-bench runner --data dataset --num-workers $w --rounds 6 --steps 10 > $OUT/runner-dataset-w$w.log 2>&1
done
clorch-bench runner --data tensor --rounds 6 --steps 10 > $OUT/runner-tensor.log 2>&1
tail -n 4 $OUT/*.log
