#!/usr/bin/env bash
# A sweep's trials on one GPU: what a one-step trial costs beyond a fresh process training one
# step (clorch-bench sweep --only trials --device cuda), and a short sweep's console.
#   bash scripts/gpu-sweep.sh            (results under $OUT when set, else /tmp/gpu-sweep)
set -uo pipefail
source scripts/gpu-setup.sh
OUT=${OUT:-/tmp/gpu-sweep}; mkdir -p $OUT
python3 -c 'import optuna, torch; print("optuna", optuna.__version__, "torch", torch.__version__)' | tee -a $OUT/env.txt
clorch-bench sweep --only trials --device cuda --trials 8 --rounds 3 2>&1 | tee $OUT/bench_sweep_trials.txt
python3 scripts/trial_cost.py --steps 100 --runs 2 --sweep 3 --out $OUT 2>&1 | tee $OUT/trial_cost.txt
