#!/usr/bin/env bash
# One device call for wip/next2 (not yet run on a GPU): warm the changed sources' kernels, run the tests that cover
# them, then the A/B figures (same-run peers: torch FLASH / cuDNN for the backward, copy / torch / Triton for the
# norms). ~4 min on the H200 (the same steps took 217 s at e0db513). Usage, from the repo root on the device:
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/next2_call.sh
set -u
export PYTHONPATH=. MPLBACKEND=Agg PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python experiments/scratch/warm.py attention_bwd.cu norm.cu 2>&1 | tail -1
CUFLASH_WARM_CACHE=0 CUFLASH_GPU_RECORD=experiments/results/h200_next2_tests.json timeout 300 \
  python -m pytest -q -n 14 -p no:cacheprovider -o addopts="-ra --benchmark-disable" \
  tests/test_attention_bwd.py tests/test_amp.py tests/test_norm.py 2>&1 | tail -5
python experiments/attention_bwd_bench.py --quick 2>&1 | grep "^|"
timeout 120 python experiments/norm_sweep.py --kinds layer 2>&1 | grep -v "it/s" | tail -3
timeout 60 python experiments/norm_tune.py --hiddens 1024,2048,4096 --kinds layer --rep 10 2>&1 | grep "layer bfloat16"
tar czf "$OUT/r.tgz" experiments/results plots
