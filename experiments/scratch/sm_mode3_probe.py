"""Probe (#3, scratch): sm_mode2_probe found one y allocation slow (0.151 ms, float32 32K, C = 2) and later ones fast
(0.144) with the same x; sm_dist_probe (x, y inside one 1.5 GiB cudaMalloc, y first written by a copy) ran every
row fast, bfloat16 64K included (0.145 against 0.152). Is it y's contents before the launch, the allocation, or
time? Each step re-times the same (x, y) after one change; pointers printed.
    PYTHONPATH=. python experiments/scratch/sm_mode3_probe.py"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cupy as cp  # noqa: E402
from _softmax_probe import NBYTES, bench, fill_normal, own_array, sm  # noqa: E402
from cuflash import _dtypes  # noqa: E402

out = []


arr = own_array


def timeit(tag, x, y):
    pr = sm._prepare(x, -1, sm.OP_SOFTMAX, "online", None)
    r = bench.time_cuda(lambda: sm._exec(pr, x, sm.OP_SOFTMAX, "online", y=y), warmup=3, rep=30)
    out.append(dict(tag=tag, dtype=str(x.dtype), cols=x.shape[1], x=x.data.ptr, y=y.data.ptr, **r))
    print("%-34s %-8s %6d x %x y %x median %.4f min %.4f" % (tag, x.dtype, x.shape[1], x.data.ptr, y.data.ptr,
          r["median_ms"], r["min_ms"]), flush=True)


for dname, cols in (("float32", 32768), ("bfloat16", 65536), ("float32", 131072)):
    dt = getattr(_dtypes, dname)
    shp = (NBYTES // (cols * dt.itemsize), cols)
    x = arr(dt, shp)
    fill_normal(x)
    ys = [arr(dt, shp) for _ in range(3)]
    for i, y in enumerate(ys):
        timeit(f"y{i} fresh", x, y)
    for i, y in enumerate(ys):
        y.view(cp.uint8)[...] = 0
        timeit(f"y{i} zeroed", x, y)
        cp.copyto(y.view(cp.uint8).reshape(-1), x.view(cp.uint8).reshape(-1))
        timeit(f"y{i} holding x's bytes", x, y)
        y.view(cp.uint8)[...] = 7
        timeit(f"y{i} holding 7s", x, y)
    timeit("y0 again", x, ys[0])
    del x, ys
bench.write_results(f"sm_mode3_probe_{bench.git_commit()[:7]}", out)
