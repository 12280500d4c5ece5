# all_reduce on one NCCL rank: clorch with and without its fast path, alternating, in-process ranks.
export RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1
for i in 1 2; do
  for mode in fast full; do
    echo "=== $mode $i $(date -u +%T)"
    MASTER_PORT=$((29600 + i)) MODE=$mode timeout 60 python3 -c "
import os, sys
from clorch.distributed import collectives as C
if os.environ['MODE'] == 'full':
    C._fast_group = lambda tensor, op: None
from clorch.bench import allreduce
sys.exit(allreduce.main(['--backend', 'nccl', '--sizes', '4', '4K', '1M', '--rounds', '9']))"
  done
done
