#!/usr/bin/env bash
# gpt_bf16 end to end at several commits (2 GPUs, one rank each): the final eval_exact.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
root=$PWD
for n in ${COMMITS}; do
  mkdir -p /tmp/b/$n && cd /tmp/b/$n
  start=$SECONDS
  PYTHONPATH=$root/bisect/$n:/tmp/site timeout 150 python3 -c "from clorch.cli import main; main()" +recipe=gpt_bf16 ${EXTRA:-} > log.txt 2>&1
  echo "$n rc=$? $((SECONDS-start))s $(grep 'clorch-train:' log.txt | tail -1)"
  cd $root
done
