#!/usr/bin/env bash
# One device call for a norm.cu change (written for wip/bwd-stream): warm norm.cu's kernels, run test_norm (record
# h200_norm_tests.json), then the whole norm sweep (LayerNorm and RMSNorm, forward / residual / backward, copy, torch
# and Triton in the same run). About 190 s on the H200 after the machine starts.
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/bwd_stream_call.sh
set -u
export PYTHONPATH=. MPLBACKEND=Agg PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python experiments/scratch/warm.py norm.cu 2>&1 | tail -1
CUFLASH_WARM_CACHE=0 CUFLASH_GPU_RECORD=experiments/results/h200_norm_tests.json timeout 300 \
  python -m pytest -q -n 14 -p no:cacheprovider -o addopts="-ra --benchmark-disable" tests/test_norm.py 2>&1 | tail -8
timeout 200 python experiments/norm_sweep.py 2>&1 | grep -v "it/s" | tail -3
python experiments/scratch/norm_rows.py
tar czf "$OUT/r.tgz" experiments/results plots
