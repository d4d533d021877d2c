#!/usr/bin/env bash
# One device call for the cluster backward (norm_bwd_cluster): warm norm.cu's backward kernels, report the
# driver's max active clusters, memcheck one small call per cluster size, run test_norm's backward tests, then the
# backward sweep at 8K-32K with the cluster path (BWD_CLUSTER_LAG on), then at 16K-32K with BWD_CLUSTER_LAG off;
# copy and torch in each run.
#   CUFLASH_COMMIT=<hash> bash experiments/scratch/bwd_cluster_call.sh
set -u
export PYTHONPATH=. MPLBACKEND=Agg PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python experiments/scratch/warm.py norm.cu --match bwd,reduce 2>&1 | tail -1
python - <<'PY'
from cuflash import norm
import numpy as np
from cuflash import _dtypes
for dt, h in ((_dtypes.bfloat16, 32768), (_dtypes.bfloat16, 65536), (_dtypes.bfloat16, 131072), (np.dtype(np.float32), 16384), (np.dtype(np.float32), 32768)):
    pl = norm._bwd_config(norm.LAYER, np.dtype(dt), np.dtype(dt), h, True, 0)
    print("plan", dt, h, "cluster", pl.cluster, "G", pl.G, "max_blocks", pl.max_blocks, "smem", pl.smem)
PY
cat > /tmp/mc.py <<'PY'
import cupy as cp, numpy as np
from cuflash import norm, _dtypes
for h in (32768, 32776, 65536, 131072):
    x = cp.asarray(np.random.standard_normal((5, h)).astype(_dtypes.bfloat16))
    w = cp.asarray(np.random.standard_normal(h).astype(_dtypes.bfloat16))
    y, mu, rs = norm.layer_norm(x, (h,), w, w, return_stats=True)
    dx, dw, db = norm.layer_norm_backward(x, x, w, mu, rs)
    cp.cuda.Device().synchronize()
print("memcheck run ok")
PY
timeout 120 compute-sanitizer --tool memcheck --print-limit 5 python /tmp/mc.py 2>&1 | tail -4
timeout 120 compute-sanitizer --tool synccheck --print-limit 5 python /tmp/mc.py 2>&1 | tail -3
CUFLASH_WARM_CACHE=0 timeout 300 python -m pytest -q -n 14 -p no:cacheprovider -o addopts="-ra --benchmark-disable" \
  tests/test_norm.py -k "backward" 2>&1 | tail -8
timeout 100 python experiments/norm_sweep.py --ops bwd --hiddens 8192,16384,32768 --no-triton \
  --name norm_bwd_cluster 2>&1 | grep -v "it/s" | tail -1
timeout 100 python -c "
import sys, runpy; import cuflash.norm as n; n.BWD_CLUSTER_LAG = False
sys.argv = ['norm_sweep.py', '--ops', 'bwd', '--hiddens', '16384,32768', '--no-triton', '--name', 'norm_bwd_nolag']
runpy.run_path('experiments/norm_sweep.py', run_name='__main__')" 2>&1 | grep -v "it/s" | tail -1
python experiments/scratch/norm_rows.py experiments/results/norm_bwd_nolag.json \
  experiments/results/norm_bwd_cluster.json
tar czf "$OUT/r.tgz" experiments/results plots
