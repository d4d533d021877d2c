"""Probe (#4, scratch): one plain LayerNorm forward on the cluster path (FWD_CLUSTER_PLAIN_LAYER; weight and bias
staged by cp.async.ca since 931841a) with weight and bias (affine 1) or without (0), for Nsight Compute:
    ncu --kernel-name regex:norm_fwd_cluster --launch-skip 2 --launch-count 1 --section ... \\
        python experiments/scratch/ln_cluster_ncu.py float32 16384 1"""
import sys

import cupy as cp

from cuflash import _dtypes, norm as nm

dname, hidden, affine = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dt = getattr(_dtypes, dname)
rows = (256 << 20) // (hidden * dt.itemsize)
x = cp.random.standard_normal((rows, hidden), dtype=cp.float32).astype(dt)
w = (1 + 0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt) if affine else None
b = (0.1 * cp.random.standard_normal(hidden, dtype=cp.float32)).astype(dt) if affine else None
nm.FWD_CLUSTER_PLAIN_LAYER = True
for _ in range(3):
    nm.layer_norm(x, (hidden,), w, b)
cp.cuda.runtime.deviceSynchronize()
