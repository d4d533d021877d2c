"""Probe (#3, scratch): steady-state rate against fixed cost per launch. Times softmax (automatic plan) and the
device-to-device copy at 64, 128, 256 and 512 MiB of input for each shape (rows scale, cols fixed), three rounds;
the slope between the sizes is the steady-state rate, the intercept the fixed cost of one launch (ramp-up and
tail). If cuflash's slope is near copy's and its intercept larger, the gap to copy at 256 MiB is the launch's ends,
not its stream. Writes experiments/results/softmax_slope_probe_<commit>.json.
    PYTHONPATH=. python experiments/scratch/softmax_slope_probe.py"""
import numpy as np
import cupy as cp
from _softmax_probe import bench, sm, sw
from cuflash import _dtypes

SHAPES = [("bfloat16", 16384), ("bfloat16", 32768), ("float32", 32768), ("bfloat16", 65536), ("float32", 65536),
          ("float32", 131072), ("bfloat16", 131072)]
MIBS = (64, 128, 256, 512)
out = []
for rnd in range(2):
    for mib in MIBS:
        nb = mib << 20
        src = cp.empty(nb, dtype=cp.uint8)
        dst = cp.empty_like(src)
        ms = bench.time_cuda(lambda: cp.copyto(dst, src), warmup=3, rep=30)["median_ms"]
        out.append(dict(round=rnd, impl="copy", dtype="-", cols=0, mib=mib, ms=ms))
        del src, dst
    for dname, cols in SHAPES:
        dt = getattr(_dtypes, dname)
        for mib in MIBS:
            rows = (mib << 20) // (cols * dt.itemsize)
            x, _ = sw._inputs(rows, cols, dname, None)
            _, pl = sm._softmax_impl(x, -1, sm.OP_SOFTMAX, "online", None, return_plan=True)
            ms = bench.time_cuda(lambda: sm._softmax_impl(x, -1, sm.OP_SOFTMAX, "online", None), warmup=3,
                                 rep=30)["median_ms"]
            out.append(dict(round=rnd, impl="cuflash", dtype=dname, cols=cols, mib=mib, rows=rows, ms=ms,
                            path=pl.path, C=pl.chunks, threads=pl.threads))
            del x
print("impl dtype cols | ms at", MIBS, "| slope GB/s (r+w) | intercept us | frac of copy at 256 MiB")
keys = sorted({(r["impl"], r["dtype"], r["cols"]) for r in out})
fits = {}
for k in keys:
    ms = [min(r["ms"] for r in out if (r["impl"], r["dtype"], r["cols"]) == k and r["mib"] == m) for m in MIBS]
    b = np.array(MIBS, float) * 2 * (1 << 20)
    slope, icpt = np.polyfit(b, np.array(ms) * 1e-3, 1)
    fits[k] = (ms, 1 / slope / 1e9, icpt * 1e6)
cms = fits[("copy", "-", 0)][0][MIBS.index(256)]
for k, (ms, gb, us) in fits.items():
    print(*k, "|", " ".join("%.4f" % m for m in ms), "| %.0f | %.1f | %.3f" % (gb, us, cms / ms[MIBS.index(256)]))
bench.write_results(f"softmax_slope_probe_{bench.git_commit()[:7]}", out, {"fits": {" ".join(map(str, k)): v for k, v in fits.items()}})
