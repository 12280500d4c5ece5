# Sourced by the GPU scripts (gpu-verify.sh, gpu-2gpu.sh): the environment they share.
# - NVLink multicast off (it can take a shared host's GPUs out of service);
# - the wheels carried in .whl/ (when present: hydra-core, omegaconf, antlr4, optuna with alembic,
#   sqlalchemy, colorlog and mako, torchao, liger-kernel; not numpy, PyYAML or the others the image
#   has) installed into /tmp/site;
# - clorch run from this checkout (its conf/ and recipes/ are found beside the package), with
#   `clorch-train` and `clorch-bench` wrappers for the interpreter $PY in $CLORCH_BIN.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
SITE=/tmp/site
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .whl/*.whl || exit 1
fi
export PYTHONPATH=$PWD:$SITE
PY=${PYTHON:-python3}
CLORCH_BIN=$(mktemp -d /tmp/clorch-bin.XXXXXX)
printf '#!/bin/sh\nexec %s -c "from clorch.cli import main; main()" "$@"\n' "$PY" > $CLORCH_BIN/clorch-train
printf '#!/bin/sh\nexec %s -m clorch.bench.cli "$@"\n' "$PY" > $CLORCH_BIN/clorch-bench
chmod +x $CLORCH_BIN/*
export PATH=$CLORCH_BIN:$PATH
