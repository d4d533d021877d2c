#!/usr/bin/env bash
# One device call for wip/ln-stagew (#4, not yet run on a GPU): LayerNorm with weight and bias on the cluster
# forward with its weights staged in shared memory by cp.async (FWD_CLUSTER_LAYER_STAGED). Usage, from the repo
# root on the device (carry [".kc"]; build it first with experiments/kcache_offline.py from this commit):
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/ln_stagew_call.sh
# 1. tests/test_norm.py (GPU record experiments/results/h200_norm_tests.json; the cluster-staged edges among them);
# 2. ln_affine_probe.py on the default paths and with FWD_CLUSTER_LAYER_STAGED=4, same call (A/B);
# 3. compute-sanitizer memcheck on small staged calls.
. experiments/scratch/_call_env.sh
t0=$(date +%s); el() { echo "--- $1: $(( $(date +%s) - t0 )) s"; }
CUFLASH_GPU_RECORD=experiments/results/h200_norm_tests.json timeout 340 python -m pytest -q -n 15 \
  -p no:cacheprovider -o addopts="-ra --benchmark-disable" tests/test_norm.py 2>&1 | tail -3
pack; el tests
for s in "" "FWD_CLUSTER_LAYER_STAGED=4"; do
  timeout 60 python experiments/scratch/ln_affine_probe.py --hidden 8192 16384 32768 65536 \
    --name ln_stagew_probe${s:+_staged} ${s:+--set $s} 2>&1 | tail -10
done
pack; el probe
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 python -c "
import numpy as np, cupy as cp, cuflash
import cuflash.norm as N
N.FWD_CLUSTER_LAYER_STAGED = 4
N.FWD_CLUSTER_MIN_VECS = 1024
for dt in (cp.float32, cuflash.bfloat16):
    vec = 16 // cp.dtype(dt).itemsize
    for body in (1100, 2048, 4095):
        x = cp.random.standard_normal((3, body * vec), dtype=cp.float32).astype(dt)
        w = cp.random.standard_normal(body * vec, dtype=cp.float32).astype(dt)
        cuflash.layer_norm(x, body * vec, w, w)
cp.cuda.runtime.deviceSynchronize(); print('memcheck calls done')" 2>&1 | tail -3
el memcheck
