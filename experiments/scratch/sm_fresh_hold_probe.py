"""Probe (#3, scratch; branch wip/hold-c8): does evict-last on the cluster kernel's held copies end the slow state of
a fresh output at C = 8 as it did at C <= 4? Each variant (-DSM_HOLD_LAST_MAX_C=4, main's rule, or 8) on an output
fresh from cudaMalloc (every run its own, all allocated first and none freed, in the order h4 h8 h8 h4 h4 h8),
then on the same output after a memset (the fast state).
    PYTHONPATH=. python experiments/scratch/sm_fresh_hold_probe.py             (device)
    KC_DIR=DIR PYTHONPATH=. python experiments/scratch/sm_fresh_hold_probe.py --build   (here: the cubins)"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _softmax_probe import NBYTES, bench, copy_bandwidth, fill_normal, frac, own_array, sm  # noqa: E402
from cuflash import _compile, _dtypes  # noqa: E402

VARIANTS = {"h4": ("-DSM_HOLD_LAST_MAX_C=4",), "h8": ("-DSM_HOLD_LAST_MAX_C=8",)}
SHAPES = [("bfloat16", 131072), ("bfloat16", 262144), ("float32", 131072), ("float16", 262144)]
if "--build" in sys.argv:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import kcache_offline as ko
    jobs = [(s_, n, list(o) + list(v)) for s_, n, o, _ in _compile.declared() for v in VARIANTS.values()
            if s_ == "softmax.cu" and "softmax_cluster<" in n]
    sys.exit(1 if ko.build_many(jobs, os.environ["KC_DIR"]) else 0)
_get = _compile.get_kernel
VAR = []
_compile.get_kernel = lambda s, n, e=(): _get(s, n, tuple(e) + (tuple(VAR) if s == "softmax.cu" else ()))
out = []
copy = copy_bandwidth()
ORDER = os.environ.get("ORDER", "h4,h8,h8,h4,h4,h8").split(",")  # ABBA: each run its own output, fresh from cudaMalloc
shapes = [(dname, cols, getattr(_dtypes, dname)) for dname, cols in SHAPES]
ys = {(dname, cols, i): own_array(dt, (NBYTES // (cols * dt.itemsize), cols))  # all allocated first, none freed
      for dname, cols, dt in shapes for i in range(len(ORDER))}
for dname, cols, dt in shapes:
    shp = (NBYTES // (cols * dt.itemsize), cols)
    x = fill_normal(own_array(dt, shp))
    res = {}
    for i, v in enumerate(ORDER):
        VAR[:] = VARIANTS[v]
        sm._PREP.clear()
        pr = sm._prepare(x, -1, sm.OP_SOFTMAX, "online", None)
        y = ys[(dname, cols, i)]
        for state in ("fresh", "memset"):
            if state == "memset":
                y[...] = 0
            ms = bench.time_cuda(lambda: sm._exec(pr, x, sm.OP_SOFTMAX, "online", y=y), warmup=3,
                                 rep=30)["median_ms"]
            f = frac(shp[0], cols, dt, ms, copy)
            out.append(dict(run=i, variant=v, state=state, dtype=dname, cols=cols, C=pr.plan.chunks, ms=ms,
                            frac_of_copy=f))
            res.setdefault((v, state), []).append(f)
    print(dname, cols, "C", pr.plan.chunks, " | ".join(f"{v} {st} {' '.join('%.3f' % m for m in fs)}"
                                                      for (v, st), fs in res.items()), flush=True)
    del x
bench.write_results(f"sm_fresh_hold_probe_{bench.git_commit()[:7]}", out, {"copy_GBps": copy})
