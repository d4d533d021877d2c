"""(Its -D knobs exist only in softmax.cu of branch wip/sm-hints; on main they change nothing.) Probe (#3, scratch): can the cluster kernel itself end the slow state of a fresh output (sm_touch_probe: one
byte per 2 MiB written, or every 16 bytes read, by another kernel beforehand ends it)? Variants of softmax.cu
(SM_TOUCH=1: thread 0 reads a word of the row's output segment first; 2: prefetches it to L2; sm_variants.py
builds them) on a fresh y (its own cudaMalloc), next to base on a fresh y and on a touched one; two rounds.
    SM_VARIANTS=base,touch1,touch2 PYTHONPATH=. python experiments/scratch/sm_touch2_probe.py"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cupy as cp  # noqa: E402
from _softmax_probe import NBYTES, bench, fill_normal, own_array, sm  # noqa: E402
from cuflash import _compile, _dtypes  # noqa: E402

VARIANTS = {"base": (), "touch1": ("-DSM_TOUCH=1",), "touch2": ("-DSM_TOUCH=2",)}
SHAPES = [("float32", 32768), ("bfloat16", 65536), ("float32", 65536), ("bfloat16", 131072), ("float32", 131072),
          ("bfloat16", 262144)]
_get = _compile.get_kernel
VAR = []
sm._compile.get_kernel = lambda s, n, e=(): _get(s, n, tuple(e) + (tuple(VAR) if s == "softmax.cu" else ()))
ker = cp.RawKernel(r'''extern "C" __global__ void touch(unsigned char* p, long long n, long long step) {
  long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * step;
  if (i < n) p[i] = 1;
}''', "touch")


def fresh(dt, shape, touched=False):
    y = own_array(dt, shape)
    if touched:
        step = 2 << 20
        ker((-(-NBYTES // step // 256),), (256,), (y.view(cp.uint8).reshape(-1), cp.int64(NBYTES), cp.int64(step)))
    return y


out = []
for dname, cols in SHAPES:
    dt = getattr(_dtypes, dname)
    shp = (NBYTES // (cols * dt.itemsize), cols)
    x = fill_normal(own_array(dt, shp))
    res = {}
    for rnd in range(2):
        for v, opts in list(VARIANTS.items()) + [("base, touched y", ())]:
            VAR[:] = opts
            sm._PREP.clear()  # (missing before 2026-11-30: every variant ran the default kernel)
            y = fresh(dt, shp, touched=v.endswith("touched y"))
            pr = sm._prepare(x, -1, sm.OP_SOFTMAX, "online", None)
            ms = bench.time_cuda(lambda: sm._exec(pr, x, sm.OP_SOFTMAX, "online", y=y), warmup=3, rep=30)["median_ms"]
            out.append(dict(round=rnd, variant=v, dtype=dname, cols=cols, C=pr.plan.chunks, ms=ms))
            res.setdefault(v, []).append(ms)
            del y
    print(dname, cols, pr.plan.path, pr.plan.chunks, " | ".join(f"{v} {' '.join('%.4f' % m for m in ms)}"
                                                             for v, ms in res.items()), flush=True)
    del x
bench.write_results(f"sm_touch2_probe_{bench.git_commit()[:7]}", out)
