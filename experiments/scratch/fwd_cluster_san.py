"""A few small calls of the cluster forward (norm_fwd_cluster) at every cluster size, for compute-sanitizer
(memcheck / synccheck): python experiments/scratch/fwd_cluster_san.py [hold | prefetch | prefetch3]
(hold: FWD_CLUSTER_HOLD, plain LayerNorm on the cluster path too, and more rows than clusters; prefetch: also
FWD_CLUSTER_PREFETCH = 2, prefetch3: = 3)"""
import sys

sys.path.insert(0, ".")
import cupy as cp  # noqa: E402

from cuflash import norm  # noqa: E402

norm.FWD_CLUSTER_MIN_VECS = 1024
hold = sys.argv[1:] in (["hold"], ["prefetch"], ["prefetch3"])
if hold:
    norm.FWD_CLUSTER_HOLD = norm.FWD_CLUSTER_PLAIN_LAYER = True
    norm.FWD_CLUSTER_PREFETCH = {"prefetch": 2, "prefetch3": 3}.get(sys.argv[1], 0)
for dt, vec in ((cp.float32, 4), (cp.float16, 8)):
    for body in (1100, 2048, 4096, 4097, 8192):  # 2 (partly empty), 2, 4, 8 (last block empty), 8 blocks
        h = body * vec
        n = 600 if hold else 3
        x = cp.random.standard_normal((n, h), dtype=cp.float32).astype(dt)
        r = cp.random.standard_normal((n, h), dtype=cp.float32).astype(dt)
        w = cp.random.standard_normal(h, dtype=cp.float32)
        b = cp.random.standard_normal(h, dtype=cp.float32)
        norm.layer_norm(x, (h,), w, b, residual=r, return_stats=True)
        norm.rms_norm(x, (h,), w.astype(dt), return_stats=True)
        if hold:
            norm.layer_norm(x, (h,), w, b, return_stats=True)
        print(dt.__name__, h, norm._fwd_config(norm.LAYER, cp.dtype(dt), cp.dtype(cp.float32), h, True, 0).cluster)
cp.cuda.Device().synchronize()
print("ok")
