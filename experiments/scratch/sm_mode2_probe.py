"""Probe (#3, scratch): what puts a cluster row in its slow mode (sm_mode_probe: float32 32K ran 0.1426 ms, then 0.149
after a bfloat16 64K launch, with the same input). Arrays from their own cudaMalloc (cupy.cuda.Memory, no pool) of a
chosen size, so where x and y live is known: is it the state the GPU is left in, or where y (or x) lies?
    PYTHONPATH=. python experiments/scratch/sm_mode2_probe.py"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cupy as cp  # noqa: E402
from _softmax_probe import NBYTES, bench, fill_normal, own_array, sm  # noqa: E402
from cuflash import _dtypes  # noqa: E402

MiB = 1 << 20
out = []


arr = own_array


def timeit(tag, x, y):
    pr = sm._prepare(x, -1, sm.OP_SOFTMAX, "online", None)
    r = bench.time_cuda(lambda: sm._exec(pr, x, sm.OP_SOFTMAX, "online", y=y), warmup=3, rep=30)
    out.append(dict(tag=tag, dtype=str(x.dtype), cols=x.shape[1], **r))
    print("%-40s %-8s %6d  median %.4f  min %.4f" % (tag, x.dtype, x.shape[1], r["median_ms"], r["min_ms"]),
          flush=True)


fill = fill_normal


for cols in (32768, 131072):
    shp = (NBYTES // (cols * 4), cols)
    x = arr(cp.float32, shp)
    fill(x)
    ya = arr(cp.float32, shp)
    timeit("x own, y own", x, ya)
    bshape = (NBYTES // (65536 * 2), 65536)
    xb, yb = arr(_dtypes.bfloat16, bshape), arr(_dtypes.bfloat16, bshape)
    fill(xb)
    timeit("bf16 64K, own x y", xb, yb)
    timeit("same x, y after bf16", x, ya)
    timeit("bf16 64K again", xb, yb)
    x2 = arr(cp.float32, shp)
    x2[...] = x
    timeit("new x copy, same y", x2, ya)
    for size in (256, 512, 1024, 2048):
        yv = arr(cp.float32, shp, size * MiB)
        timeit(f"same x, y in a {size} MiB alloc", x, yv)
        del yv
    for size in (512, 1024):
        xv = arr(cp.float32, shp, size * MiB)
        xv[...] = x
        timeit(f"x in a {size} MiB alloc, y own", xv, ya)
        del xv
    for size in (512, 1024):
        xv, yv = arr(_dtypes.bfloat16, bshape, size * MiB), arr(_dtypes.bfloat16, bshape, size * MiB)
        xv[...] = xb
        timeit(f"bf16 64K, x y in {size} MiB allocs", xv, yv)
        del xv, yv
    timeit("x own, y own (end)", x, ya)
    del x, ya, xb, yb, x2
    cp.get_default_memory_pool().free_all_blocks()
bench.write_results(f"sm_mode2_probe_{bench.git_commit()[:7]}", out)
