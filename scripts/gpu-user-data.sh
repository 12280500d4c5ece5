#!/usr/bin/env bash
# One H200: the CUDA test tier; your own dataset through clorch-train on CUDA (exported as
# safetensors, then loaded by a second run with model.init_from); and `clorch-bench runner
# --data dataset` (GPT-2 small, bf16, token windows read from a uint16 token file) against a plain
# DataLoader loop, with 0 and 2 workers; then the tensor path.
# Run from the repository root on the GPU machine; logs go to $OUT (or ./gpu-out).
set -u
source scripts/gpu-setup.sh
OUT=${OUT:-gpu-out}; mkdir -p $OUT; OUT=$(cd $OUT && pwd)
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"; } > $OUT/versions.txt 2>&1
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 420 $PY -m pytest -q -m cuda -p no:cacheprovider tests > $OUT/cuda-tests.log 2>&1
  echo "cuda tests rc=$?" >> $OUT/cuda-tests.log
fi
WORK=$(mktemp -d /tmp/clorch-user-data.XXXXXX)
(cd $WORK && clorch-train +recipe=ddp_bf16 data._target_=clorch.data.datasets.Blobs loss=cross_entropy \
   data.sample_count=8192 data.num_workers=2 epochs=2 checkpoint.export=safetensors hydra.run.dir=first \
   > $OUT/user-data-train.log 2>&1; echo "train rc=$?" >> $OUT/user-data-train.log
 clorch-train +recipe=ddp_bf16 data._target_=clorch.data.datasets.Blobs loss=cross_entropy \
   data.sample_count=8192 epochs=1 model.init_from=first/model.safetensors hydra.run.dir=second \
   > $OUT/user-data-init-from.log 2>&1; echo "init_from rc=$?" >> $OUT/user-data-init-from.log)
for w in 0 2; do
  clorch-bench runner --data dataset --num-workers $w --rounds 6 --steps 10 > $OUT/runner-dataset-w$w.log 2>&1
done
clorch-bench runner --data tensor --rounds 6 --steps 10 > $OUT/runner-tensor.log 2>&1
tail -n 4 $OUT/*.log
