"""Probe (#4, scratch): the norms' steady-state rate against their fixed cost per launch, as softmax_slope_probe.py
for softmax: layer_norm (weight and bias) and rms_norm (weight) forward at 64, 128, 256 and 512 MiB of input per
shape (tokens scale, hidden fixed), with the device copy, two rounds; slope and intercept of time against bytes.
    PYTHONPATH=. python experiments/scratch/norm_slope_probe.py"""
import numpy as np
import cupy as cp

import cuflash
from cuflash import _dtypes, bench

SHAPES = [("bfloat16", 1024), ("bfloat16", 8192), ("bfloat16", 16384), ("bfloat16", 32768), ("float32", 1024),
          ("float32", 16384), ("float32", 32768)]
MIBS = (64, 128, 256, 512)
out = []
for rnd in range(2):
    for mib in MIBS:
        src = cp.empty(mib << 20, dtype=cp.uint8)
        dst = cp.empty_like(src)
        dst[...] = 1
        ms = bench.time_cuda(lambda: cp.copyto(dst, src), warmup=3, rep=30)["median_ms"]
        out.append(dict(round=rnd, impl="copy", dtype="-", hidden=0, mib=mib, ms=ms))
        del src, dst
    for dname, n in SHAPES:
        dt = getattr(_dtypes, dname)
        w, b = (cp.random.standard_normal(n, dtype=cp.float32).astype(dt) for _ in range(2))
        for mib in MIBS:
            rows = (mib << 20) // (n * dt.itemsize)
            x = cp.random.standard_normal((rows, n), dtype=cp.float32).astype(dt)
            for op, fn in (("layer_norm", lambda: cuflash.layer_norm(x, (n,), w, b)),
                           ("rms_norm", lambda: cuflash.rms_norm(x, (n,), w))):
                ms = bench.time_cuda(fn, warmup=3, rep=30)["median_ms"]
                out.append(dict(round=rnd, impl=op, dtype=dname, hidden=n, mib=mib, ms=ms))
            del x
print("impl dtype hidden | ms at", MIBS, "| slope GB/s (r+w) | intercept us | frac of copy at 256 MiB")
fits = {}
for k in sorted({(r["impl"], r["dtype"], r["hidden"]) for r in out}):
    ms = [min(r["ms"] for r in out if (r["impl"], r["dtype"], r["hidden"]) == k and r["mib"] == m) for m in MIBS]
    slope, icpt = np.polyfit(np.array(MIBS, float) * 2 * (1 << 20), np.array(ms) * 1e-3, 1)
    fits[k] = (ms, 1 / slope / 1e9, icpt * 1e6)
cms = fits[("copy", "-", 0)][0][MIBS.index(256)]
for k, (ms, gb, us) in fits.items():
    print(*k, "|", " ".join("%.4f" % m for m in ms), "| %.0f | %.1f | %.3f" % (gb, us, cms / ms[MIBS.index(256)]))
bench.write_results(f"norm_slope_probe_{bench.git_commit()[:7]}", out,
                    {"fits": {" ".join(map(str, k)): v for k, v in fits.items()}})
