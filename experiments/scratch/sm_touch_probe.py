"""Probe (#3, scratch): a y fresh from cudaMalloc makes the cluster rows ~5 % slower until another kernel writes it
(sm_mode3_probe: 33 launches of the cluster kernel itself did not change it; a fill or a copy did). Which writes or
reads of a fresh y end that, and at what granularity? Each case: a fresh y, an action, then float32 32K (C = 2).
    PYTHONPATH=. python experiments/scratch/sm_touch_probe.py"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cupy as cp  # noqa: E402
from _softmax_probe import NBYTES, bench, fill_normal, own_array, sm  # noqa: E402
from cuflash import _dtypes  # noqa: E402

out = []
KB = 1 << 10


arr = own_array


def timeit(tag, x, y, partition=None):
    pr = sm._prepare(x, -1, sm.OP_SOFTMAX, "online", partition)
    r = bench.time_cuda(lambda: sm._exec(pr, x, sm.OP_SOFTMAX, "online", y=y), warmup=3, rep=30)
    out.append(dict(tag=tag, dtype=str(x.dtype), cols=x.shape[1], path=pr.plan.path, **r))
    print("%-44s %-8s %6d %-7s median %.4f min %.4f" % (tag, x.dtype, x.shape[1], pr.plan.path, r["median_ms"],
          r["min_ms"]), flush=True)


shp = (NBYTES // (32768 * 4), 32768)
x = arr(cp.float32, shp)
fill_normal(x)
xb = arr(_dtypes.bfloat16, (NBYTES // (32768 * 2), 32768))
fill_normal(xb)
xk = arr(cp.float32, (NBYTES // (8192 * 4), 8192))
fill_normal(xk)
yb_shape = xb.shape
ker = cp.RawKernel(r'''extern "C" __global__ void touch(unsigned char* p, long long n, long long step, int write) {
  long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * step;
  if (i < n) { if (write) p[i] = 1; else if (p[i] == 255 && step == 3) p[0] = 0; }
}''', "touch")


def touch(y, step, write=1):
    n = y.nbytes
    cnt = -(-n // step)
    ker((-(-cnt // 256),), (256,), (y.view(cp.uint8).reshape(-1), cp.int64(n), cp.int64(step), cp.int32(write)))


y = arr(cp.float32, shp)
timeit("fresh y", x, y)
timeit("fresh y, again", x, y)
y = arr(cp.float32, shp)
timeit("fresh y: block path bf16 32K first", xb, y.view(_dtypes.bfloat16).reshape(yb_shape))
timeit("... then the cluster row", x, y)
y = arr(cp.float32, shp)
timeit("fresh y: block path float32 8K first", xk, y.reshape(xk.shape))
timeit("... then the cluster row", x, y)
y = arr(cp.float32, shp)
timeit("fresh y: planner without clusters first", x, y, {"cluster": 0})
timeit("... then the cluster row", x, y)
for step in (4 * KB, 64 * KB, 2048 * KB):
    y = arr(cp.float32, shp)
    touch(y, step)
    timeit(f"fresh y, one byte written every {step // KB} KiB", x, y)
y = arr(cp.float32, shp)
touch(y, 16, write=0)
timeit("fresh y, read every 16 bytes", x, y)
y = arr(cp.float32, shp)
touch(y, 1)
timeit("fresh y, every byte written by a kernel", x, y)
bench.write_results(f"sm_touch_probe_{bench.git_commit()[:7]}", out)
